#include "pdtrain/app/checkpointing.hpp"

#include <cstdio>
#include <filesystem>

#include "pdtrain/core/agreement.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/signals.hpp"

namespace pdtrain {

namespace {

// Checkpoints present but none usable is an error, never a silent fresh start (which would
// also let retention near the damaged files): each is named with why it does not verify.
void refuse_damaged_only(const std::string& dir, const ckpt::LatestValid& latest) {
  if (!latest.path.empty() || latest.warnings.empty()) return;
  std::string msg = "--restart auto: none of the " + std::to_string(latest.warnings.size()) +
                    " checkpoint(s) in " + dir + " verifies; they are left as they are:";
  for (const std::string& w : latest.warnings) msg += "\n  " + w;
  msg += "\nrestart from an earlier copy with --restart PATH, or start at step 0 anyway with "
         "--restart fresh";
  throw Error(ExitCode::data, msg);
}

RestartPoint locate(const Deck& deck, const std::string& restart) {
  RestartPoint rp;
  if (restart == "fresh") return rp;  // asked for: step 0 whatever checkpoint.dir holds
  if (restart == "auto") {
    if (!std::filesystem::is_directory(deck.checkpoint.dir)) return rp;
    const ckpt::LatestValid latest = ckpt::find_latest_valid(deck.checkpoint.dir);
    refuse_damaged_only(deck.checkpoint.dir, latest);
    for (const std::string& w : latest.warnings)
      std::fprintf(stderr, "pdtrain: warning: skipping a newer checkpoint: %s\n", w.c_str());
    if (latest.path.empty()) {
      std::printf("restart: no checkpoint in %s, starting fresh\n", deck.checkpoint.dir.c_str());
      return rp;
    }
    rp.path = latest.path;
  } else {
    rp.path = restart;
    if (!std::filesystem::exists(rp.path))
      throw Error(ExitCode::data, "--restart " + rp.path + ": no such checkpoint");
  }
  const ckpt::CheckpointMeta meta = ckpt::read_meta(rp.path);
  if (!meta.complete) throw Error(ExitCode::data, rp.path + ": incomplete checkpoint");
  rp.step = meta.step;
  rp.version = meta.version;
  rp.lossy = meta.codec == ckpt::Codec::bitdelta;
  return rp;
}

}  // namespace

RestartPoint resolve_restart(const Deck& deck, const std::string& restart, MPI_Comm world) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(world, &rank));
  RestartPoint rp;
  run_collectively(world, ErrorScope::job, [&] {
    if (rank == 0 && !restart.empty()) rp = locate(deck, restart);
  });
  broadcast_string(world, rp.path);
  std::int64_t nums[3] = {rp.step, rp.version, rp.lossy ? 1 : 0};
  MPI_CHECK(MPI_Bcast(nums, 3, MPI_INT64_T, 0, world));
  rp.step = nums[0], rp.version = nums[1], rp.lossy = nums[2] != 0;
  if (rank == 0 && !rp.path.empty()) {
    std::printf("restart: from %s (step %lld)%s\n", rp.path.c_str(),
                static_cast<long long>(rp.step),
                rp.lossy ? " | APPROXIMATE: a lossy bitdelta checkpoint (pdtrain inspect shows its error bounds)" : "");
    std::fflush(stdout);
  }
  return rp;
}

std::map<int, BlockState> read_restart_state(const RestartPoint& rp, const ParamCatalog& cat,
                                             MPI_Comm comm, const std::vector<int>& ids) {
  ckpt::Checkpoint c = ckpt::read_checkpoint(rp.path, cat, comm, ids);
  return std::move(c.blocks);
}

HolderHooks checkpoint_hooks(ckpt::CheckpointWriter& writer, const Deck& deck,
                             const std::string& layout_text, std::int64_t tokens_per_step,
                             bool verbose) {
  auto last_written = std::make_shared<std::int64_t>(-1);
  auto save = [&writer, &deck, layout_text, tokens_per_step, last_written, verbose](
                  std::int64_t version, const HolderHooks::OwnedBlocks& blocks, bool async) {
    const std::string path =
        async ? writer.write_async(version, version, version * tokens_per_step,
                                   deck.resolved_toml(), layout_text, blocks)
              : writer.write(version, version, version * tokens_per_step, deck.resolved_toml(),
                             layout_text, blocks);
    *last_written = version;
    if (verbose) {
      if (async)
        std::printf("checkpoint: %s (encoding in the background)\n", path.c_str());
      else
        std::printf("checkpoint: %s (%.2f s, %.1f MiB)\n", path.c_str(),
                    writer.last_stats().commit_seconds,
                    static_cast<double>(writer.last_stats().file_bytes) / 1048576.0);
      std::fflush(stdout);
    }
  };
  HolderHooks h;
  h.after_update = [&writer, &deck, save](std::int64_t version,
                                          const HolderHooks::BlocksGetter& blocks) {
    if (writer.pending()) writer.poll();
    if (deck.checkpoint.every > 0 && version % deck.checkpoint.every == 0)
      save(version, blocks(), deck.checkpoint.async);
  };
  h.at_end = [&writer, save, last_written](std::int64_t version,
                                           const HolderHooks::BlocksGetter& blocks) {
    if (writer.pending()) writer.wait();
    if (*last_written != version) save(version, blocks(), false);
  };
  h.after_divergence = [&writer] {  // the checkpoints written before it stay as they are
    if (writer.pending()) writer.wait();
  };
  h.stop_requested = [] { return stop_signal_received(); };
  return h;
}

}  // namespace pdtrain
