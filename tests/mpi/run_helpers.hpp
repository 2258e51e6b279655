#pragma once
// The MPI training tests' deck and runs: the tiny deck they change, scratch paths, and runs on
// groups of ranks whose reporter's results every rank of the group shares, so that
// expectations hold on any rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "pdtrain/app/train.hpp"

namespace pdtrain::test {

// The deck the training tests start from: a tiny model on the synthetic copy task at lag 1,
// which it learns within 20 steps at lr 1e-2 (5 warm-up steps, then down to 1e-3); one rank,
// the replicated baseline, validation only at the end. `changes` ("section.key=value", the
// value a TOML literal) replace its keys or add others, as in a deck file: a test's deck names
// only what makes it its own.
inline std::string tiny_deck(const std::vector<std::string>& changes = {}) {
  std::vector<std::pair<std::string, std::vector<std::string>>> sections = {
      {"run", {"seed = 7", "steps = 20"}},
      {"model", {"n_layer = 2", "n_head = 2", "d_model = 16", "vocab_size = 32", "seq_len = 16"}},
      {"data", {"copy_lag = 1", "copy_prob = 0.9"}},
      {"parallel", {"holders = 0"}},
      {"train", {"batch_size = 12", "eval_every = 0", "eval_batches = 1"}},
      {"optimizer", {"lr = 1e-2", "min_lr = 1e-3", "warmup_steps = 5"}}};
  for (const std::string& c : changes) {
    const std::size_t dot = c.find('.'), eq = c.find('=');
    const std::string section = c.substr(0, dot), key = c.substr(dot + 1, eq - dot - 1);
    const std::string line = key + " = " + c.substr(eq + 1);
    auto s = std::find_if(sections.begin(), sections.end(),
                          [&](const auto& named) { return named.first == section; });
    if (s == sections.end()) s = sections.insert(s, {section, {}});
    std::vector<std::string>& lines = s->second;
    auto k = std::find_if(lines.begin(), lines.end(),
                          [&](const std::string& l) { return l.rfind(key + " = ", 0) == 0; });
    if (k == lines.end())
      lines.push_back(line);
    else
      *k = line;
  }
  std::string text;
  for (const auto& [section, lines] : sections) {
    text += "[" + section + "]\n";
    for (const std::string& l : lines) text += l + "\n";
  }
  return text;
}

inline int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// "pdtrain-<name>" in the temporary directory: a test's output directory or file; with
// PDTRAIN_TEST_RUN_TAG set (ctest does, where one test binary runs as several tests that may run
// at once) "pdtrain-<tag>-<name>", so that they never share a run.out_dir.
inline std::string temp_path(const std::string& name) {
  const char* tag = std::getenv("PDTRAIN_TEST_RUN_TAG");
  const std::string prefix = tag != nullptr && *tag != '\0' ? "pdtrain-" + std::string(tag) + "-" : "pdtrain-";
  return (std::filesystem::temp_directory_path() / (prefix + name)).string();
}

struct RunOutcome {
  std::vector<double> losses;
  std::uint32_t crc = 0;
  // Whether this rank was in a group that ran (run_on_groups): a rank that sat the run out has
  // nothing to compare, every rank that ran has the group's losses (checked there).
  bool ran = false;
};

// Shares `r` of rank `root` with every rank of `comm`.
inline void share(RunOutcome& r, int root, MPI_Comm comm) {
  int n = static_cast<int>(r.losses.size());
  MPI_Bcast(&n, 1, MPI_INT, root, comm);
  r.losses.resize(static_cast<std::size_t>(n));
  MPI_Bcast(r.losses.data(), n, MPI_DOUBLE, root, comm);
  MPI_Bcast(&r.crc, 1, MPI_UINT32_T, root, comm);
}

// The rank of `comm` that reported `r`'s run (the compute rank dp 0, tp 0, last stage: where it
// sits depends on how holders were placed over the nodes, so it is asked, not guessed); -1 if
// none did. Collective over `comm`.
inline int reporting_rank(const TrainResult& r, MPI_Comm comm) {
  int rank = 0, reporter = -1;
  MPI_Comm_rank(comm, &rank);
  const int mine = r.reporter ? rank : -1;
  MPI_Allreduce(&mine, &reporter, 1, MPI_INT, MPI_MAX, comm);
  return reporter;
}

inline RunOutcome run_deck(const std::string& deck_text, const std::vector<std::string>& sets,
                           MPI_Comm comm, RunOptions opts = {}) {
  const Deck deck = parse_deck(deck_text, "test.toml", sets);
  opts.verbose = false;
  const TrainResult r = run_training(deck, comm, opts);
  const int reporter = reporting_rank(r, comm);
  RunOutcome out;
  if (reporter < 0) return out;
  out.losses = r.losses;
  out.crc = r.params_crc32c;
  share(out, reporter, comm);
  return out;
}

// A communicator of `size` consecutive ranks of `comm` containing this rank: group g holds
// ranks g*size .. g*size+size-1. Ranks beyond the last full group, or beyond the first `groups`
// groups, get MPI_COMM_NULL. Collective over `comm`.
inline MPI_Comm group_of(MPI_Comm comm, int size, int groups = INT_MAX) {
  int rank = 0, world = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  const int group = rank / size;
  const int color = group < world / size && group < groups ? group : MPI_UNDEFINED;
  MPI_Comm out;
  MPI_Comm_split(comm, color, rank, &out);
  return out;
}

// The deck with `sets` run by each group of `size` world ranks (every full group, or the first
// `groups`), group g with run.out_dir "<out_dir>-<g>". Returns the outcome of this rank's
// group (ran = true); empty on ranks in no group. A group that ran without losses fails the
// test.
inline RunOutcome run_on_groups(const std::string& deck_text, int size,
                                std::vector<std::string> sets, const std::string& out_dir,
                                int groups = INT_MAX) {
  MPI_Comm g = group_of(MPI_COMM_WORLD, size, groups);
  RunOutcome r;
  if (g != MPI_COMM_NULL) {
    sets.push_back("run.out_dir=" + out_dir + "-" + std::to_string(world_rank() / size));
    r = run_deck(deck_text, sets, g);
    r.ran = true;
    MPI_Comm_free(&g);
    // A group that ran and reported no loss must fail here: the tests skip ranks that sat out,
    // and a run whose reporter printed nothing would otherwise look like one.
    if (r.losses.empty()) ADD_FAILURE() << "a group of " << size << " ranks ran " << out_dir << " but its reporter has no losses";
  }
  return r;
}

// The deck with `sets` run by world ranks 0 .. size-1 alone (run.out_dir "<out_dir>-0") while
// the others wait, its outcome shared with every rank: size 1 is the single-rank reference.
inline RunOutcome first_group_run(const std::string& deck_text, int size,
                                  std::vector<std::string> sets, const std::string& out_dir) {
  RunOutcome r = run_on_groups(deck_text, size, std::move(sets), out_dir, 1);
  share(r, 0, MPI_COMM_WORLD);  // rank 0 is in the group and holds its outcome
  return r;
}

}  // namespace pdtrain::test
