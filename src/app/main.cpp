// pdtrain: trains a GPT model with parameters held by holder ranks and compute on compute ranks.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "pdtrain/app/report.hpp"
#include "pdtrain/app/tools.hpp"
#include "pdtrain/app/train.hpp"
#include "pdtrain/core/agreement.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/signals.hpp"
#include "pdtrain/deck/sweep.hpp"
#include "pdtrain/device/nccl_collectives.hpp"
#include "pdtrain/io/summary.hpp"
#include "pdtrain/kernels/blas_runtime.hpp"
#include "pdtrain/kernels/kernel_ops.hpp"
#include "pdtrain/plan/command.hpp"
#include "pdtrain/version.hpp"

namespace {

const char* kUsage =
    "usage: pdtrain [DECK.toml] [--set section.key=value]... [--dry-run]\n"
    "               [--print-default-deck] [--help] [--version]\n"
    "       pdtrain eval [DECK.toml] [--set section.key=value]... --batches N\n"
    "       pdtrain --list-sweep DECK.toml\n"
    "       pdtrain plan [DECK.toml] [--set k=v]... [--machine FILE|NAME] [--nodes N | --ranks N]\n"
    "                    [--search [--largest]] [--nccl]   (predict memory and step time, --nccl: GPU-direct\n"
    "                    collectives whatever parallel.comm says; docs/performance-model.md)\n"
    "       mpirun -np 2 pdtrain plan --calibrate OUT.toml   (measure this machine)\n"
    "       pdtrain summarize runs/<name>\n"
    "       pdtrain inspect CHECKPOINT.h5\n"
    "       pdtrain export CHECKPOINT.h5 --format llmc OUT.bin\n"
    "       pdtrain export CHECKPOINT.h5 --format hf OUT_DIR\n"
    "       pdtrain sample CHECKPOINT.h5 [--tokens N] [--prompt TEXT] [--temperature T]\n"
    "                      [--seed S] [--tokenizer gpt2_tokenizer.bin]\n"
    "\n"
    "Trains a GPT-2 model. Without DECK, runs the embedded default deck (input/default.toml).\n"
    "Launch with MPI, e.g.  mpirun -np 3 pdtrain   (1 parameter holder + 2 compute ranks).\n"
    "\n"
    "eval: the mean loss of the initial model (model.init) over the first N consecutive,\n"
    "      non-overlapping windows of data.path, each train.batch_size x model.seq_len tokens\n"
    "      with targets shifted by one (llm.c's validation loss).\n"
    "\n"
    "sample: N new tokens (default 256) of the checkpoint's model on one process, drawn from\n"
    "      softmax(logits / T) (default 1; 0: greedy) with seed S. A model trained on text takes\n"
    "      and prints text; one trained on token shards takes token ids (\"464 3290\") and\n"
    "      prints ids, or text decoded with llm.c's tokenizer file.\n"
    "\n"
    "  --set k=v             override a deck key (checked like the deck), repeatable\n"
    "  --dry-run             print each rank's role, coordinates and blocks, then exit\n"
    "  --restart PATH|auto|fresh  continue from a checkpoint (auto: the newest valid one in\n"
    "                        checkpoint.dir, a fresh start if it holds none, an error if none\n"
    "                        of its checkpoints verifies); fresh: step 0 on purpose\n"
    "  --stop-after N        end after step N with a checkpoint (the schedule still targets\n"
    "                        run.steps), to cut a long training into several jobs\n"
    "  --sweep-index N       run point N of the deck's [sweep] (default: $SLURM_ARRAY_TASK_ID)\n"
    "  --list-sweep          print the numbered points of the deck's [sweep] and exit\n"
    "  --print-default-deck  print the embedded default deck and exit\n"
    "  --print-deck-reference  print every deck key as Markdown (docs/deck.md) and exit\n"
    "  --help, --version\n"
    "\n"
    "Exit status: 0 ok, 1 runtime fault, 2 bad deck or command line, 3 impossible layout,\n"
    "4 bad data file or I/O (unwritable directory, bad checkpoint, an output that cannot be\n"
    "written), 5 training diverged. Deck keys: docs/deck.md.\n";

struct CommandLine {
  std::string command = "train";  // train | eval | plan
  std::int64_t batches = 0;       // eval: windows to evaluate
  std::string deck_path;  // empty: the embedded default deck
  long long sweep_index = -1;
  std::string restart;
  long long stop_after = 0;
  bool list_sweep = false;
  std::string summarize_dir;
  std::vector<std::string> files;  // inspect: checkpoint; export: checkpoint, format, output
  std::vector<std::string> sets;
  pdtrain::SampleCommand sample;
  bool dry_run = false, help = false, version = false, print_default = false;
  bool print_reference = false;
  pdtrain::plan::PlanOptions plan;  // plan: --machine, --nodes, --ranks, --search, --calibrate
};

// The value after option argv[i], moving i onto it; `needs` says what is missing otherwise.
const char* option_value(int argc, char** argv, int& i, const char* needs) {
  if (i + 1 >= argc)
    throw pdtrain::Error(pdtrain::ExitCode::deck, std::string(argv[i]) + " needs " + needs);
  return argv[++i];
}

// An integer option value of at least `min`; `must` says what it must be otherwise.
long long integer_value(const std::string& option, const char* text, long long min,
                        const char* must) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (*end != '\0' || v < min)
    throw pdtrain::Error(pdtrain::ExitCode::deck,
                         option + " must be " + must + ", got '" + text + "'");
  return v;
}

// One option of `pdtrain plan` at argv[i] into `o` (moving i past its value); false if argv[i]
// is not one.
bool parse_plan_option(int argc, char** argv, int& i, pdtrain::plan::PlanOptions& o) {
  const std::string a = argv[i];
  if (a == "--machine") o.machine = option_value(argc, argv, i, "a machine file or name");
  else if (a == "--nodes") o.nodes = static_cast<int>(integer_value(a, option_value(argc, argv, i, "N"), 1, "a positive count"));
  else if (a == "--ranks") o.ranks = static_cast<int>(integer_value(a, option_value(argc, argv, i, "N"), 1, "a positive count"));
  else if (a == "--search") o.search = true;
  else if (a == "--largest") o.largest = true;
  else if (a == "--nccl") o.nccl = true;
  else if (a == "--calibrate") o.calibrate = option_value(argc, argv, i, "the machine file to write");
  else return false;
  return true;
}

// A floating-point option value of at least 0.
double nonnegative_value(const std::string& option, const char* text) {
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (*end != '\0' || !(v >= 0) || !std::isfinite(v))
    throw pdtrain::Error(pdtrain::ExitCode::deck,
                         option + " must be a number >= 0, got '" + text + "'");
  return v;
}

// pdtrain sample CHECKPOINT [--tokens N] [--prompt TEXT] [--temperature T] [--seed S]
// [--tokenizer FILE]
pdtrain::SampleCommand parse_sample(int argc, char** argv) {
  const char* usage =
      "usage: pdtrain sample CHECKPOINT.h5 [--tokens N] [--prompt TEXT] [--temperature T] "
      "[--seed S] [--tokenizer FILE]";
  if (argc < 3 || argv[2][0] == '-') throw pdtrain::Error(pdtrain::ExitCode::deck, usage);
  pdtrain::SampleCommand s;
  s.checkpoint = argv[2];
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokens") {
      s.settings.tokens = integer_value(a, option_value(argc, argv, i, "a count"), 1, "a positive integer");
    } else if (a == "--prompt") {
      s.prompt = option_value(argc, argv, i, "TEXT");
      s.has_prompt = true;
    } else if (a == "--temperature") {
      s.settings.temperature = nonnegative_value(a, option_value(argc, argv, i, "T"));
    } else if (a == "--seed") {
      s.settings.seed = static_cast<std::uint64_t>(
          integer_value(a, option_value(argc, argv, i, "S"), 0, "an integer >= 0"));
    } else if (a == "--tokenizer") {
      s.tokenizer = option_value(argc, argv, i, "FILE");
    } else {
      throw pdtrain::Error(pdtrain::ExitCode::deck, "unknown option '" + a + "'; " + usage);
    }
  }
  return s;
}

CommandLine parse_command_line(int argc, char** argv) {
  CommandLine c;
  int first = 1;
  if (argc > 1 && std::string(argv[1]) == "eval") c.command = "eval", first = 2;
  if (argc > 1 && std::string(argv[1]) == "plan") c.command = "plan", first = 2;
  if (argc > 1 && std::string(argv[1]) == "summarize") {
    if (argc != 3) throw pdtrain::Error(pdtrain::ExitCode::deck, "usage: pdtrain summarize DIR");
    c.command = "summarize";
    c.summarize_dir = argv[2];
    return c;
  }
  if (argc > 1 && std::string(argv[1]) == "inspect") {
    if (argc != 3) throw pdtrain::Error(pdtrain::ExitCode::deck, "usage: pdtrain inspect CHECKPOINT.h5");
    c.command = "inspect";
    c.files = {argv[2]};
    return c;
  }
  if (argc > 1 && std::string(argv[1]) == "sample") {
    c.command = "sample";
    c.sample = parse_sample(argc, argv);
    return c;
  }
  if (argc > 1 && std::string(argv[1]) == "export") {
    const std::string format = argc == 6 ? argv[4] : "";
    if (argc != 6 || std::string(argv[3]) != "--format" || (format != "llmc" && format != "hf"))
      throw pdtrain::Error(pdtrain::ExitCode::deck,
                           "usage: pdtrain export CHECKPOINT.h5 --format llmc OUT.bin | "
                           "--format hf OUT_DIR");
    c.command = "export";
    c.files = {argv[2], format, argv[5]};
    return c;
  }
  for (int i = first; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--batches" && c.command == "eval") {
      c.batches = integer_value(a, option_value(argc, argv, i, "a count"), 1, "a positive integer");
    } else if (c.command == "plan" && parse_plan_option(argc, argv, i, c.plan)) {
    } else if (a == "--sweep-index") {
      c.sweep_index = integer_value(a, option_value(argc, argv, i, "N"), 0, "a point number");
    } else if (a == "--restart") {
      c.restart = option_value(argc, argv, i, "PATH, auto or fresh");
    } else if (a == "--stop-after") {
      c.stop_after = integer_value(a, option_value(argc, argv, i, "a step"), 1, "a positive step");
    } else if (a == "--list-sweep") {
      c.list_sweep = true;
    } else if (a == "--set") {
      c.sets.push_back(option_value(argc, argv, i, "section.key=value"));
    } else if (a.rfind("--set=", 0) == 0) {
      c.sets.push_back(a.substr(6));
    } else if (a == "--dry-run") {
      c.dry_run = true;
    } else if (a == "--help" || a == "-h") {
      c.help = true;
    } else if (a == "--version") {
      c.version = true;
    } else if (a == "--print-default-deck") {
      c.print_default = true;
    } else if (a == "--print-deck-reference") {
      c.print_reference = true;
    } else if (!a.empty() && a[0] == '-') {
      throw pdtrain::Error(pdtrain::ExitCode::deck, "unknown option '" + a + "' (see --help)");
    } else if (c.deck_path.empty()) {
      c.deck_path = a;
    } else {
      throw pdtrain::Error(pdtrain::ExitCode::deck,
                           "more than one deck given ('" + c.deck_path + "', '" + a + "')");
    }
  }
  if (c.command == "eval" && c.batches == 0)
    throw pdtrain::Error(pdtrain::ExitCode::deck, "eval needs --batches N");
  return c;
}

// One BLAS thread per rank when ranks share a node, unless the user chose otherwise.
void choose_blas_threads() {
  if (std::getenv("OPENBLAS_NUM_THREADS") || std::getenv("OMP_NUM_THREADS")) return;
  MPI_Comm node;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int local = 1;
  MPI_CHECK(MPI_Comm_size(node, &local));
  MPI_CHECK(MPI_Comm_free(&node));
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  pdtrain::kernels::set_blas_threads(std::max(1, cores / std::max(1, local)));
}

// The deck to run: the file (or the embedded default) with --set overrides, or, when it has a
// [sweep], its point --sweep-index N (default $SLURM_ARRAY_TASK_ID, so a job array runs one
// point per task). With --list-sweep, fills `listing` with the numbered points instead.
pdtrain::Deck load(const CommandLine& cl, std::string* listing) {
  const bool file = !cl.deck_path.empty();
  const std::string name = file ? cl.deck_path : pdtrain::kDefaultDeckName;
  const std::string text = file ? pdtrain::read_deck_text(cl.deck_path)
                                : std::string(pdtrain::default_deck_text());
  pdtrain::Deck deck = pdtrain::parse_deck(text, name, cl.sets);  // checks syntax and keys
  const pdtrain::Sweep sweep = pdtrain::parse_sweep(text, name);
  const std::size_t points = sweep.points();
  if (cl.list_sweep) {
    if (points == 0) throw pdtrain::Error(pdtrain::ExitCode::deck, name + " has no [sweep] table");
    for (std::size_t n = 0; n < points; ++n)
      *listing += std::to_string(n) + "  " + deck.run.out_dir + "/" + std::to_string(n) + "-" +
                  sweep.label(n) + "\n";
    return deck;
  }
  if (points == 0) {
    if (cl.sweep_index >= 0)
      throw pdtrain::Error(pdtrain::ExitCode::deck, "--sweep-index given but " + name + " has no [sweep] table");
    return deck;
  }
  long long index = cl.sweep_index;
  if (index < 0) {
    const char* task = std::getenv("SLURM_ARRAY_TASK_ID");
    if (!task)
      throw pdtrain::Error(pdtrain::ExitCode::deck,
                           name + " has a [sweep] of " + std::to_string(points) +
                               " points: choose one with --sweep-index N (see --list-sweep) or "
                               "submit it as a Slurm job array");
    index = std::atoll(task);
  }
  return pdtrain::sweep_point_deck(text, name, cl.sets, sweep, static_cast<std::size_t>(index));
}

// A model evaluated by one process runs as the single-rank replicated baseline whatever layout
// the deck trains with: the loss does not depend on the layout (up to summation order), and a
// deck written for a parallel job then works as it is.
void run_as_one_process(pdtrain::Deck& d) {
  const char* why = "one process";
  for (const char* key : {"parallel.holders", "parallel.dp", "parallel.tp", "parallel.pp"})
    d.origin[key] = why;
  d.parallel.holders = 0;
  d.parallel.dp = 0;
  d.parallel.tp = 1;
  d.parallel.pp = 1;
}

int run(int argc, char** argv, int rank) {
  CommandLine cl;
  pdtrain::Deck deck;
  std::string listing;
  pdtrain::run_collectively(MPI_COMM_WORLD, pdtrain::ErrorScope::job, [&] {
    cl = parse_command_line(argc, argv);
    if (cl.command == "summarize") {
      if (rank == 0) pdtrain::summarize_runs(cl.summarize_dir);
    } else if (cl.command == "inspect") {
      if (rank == 0) pdtrain::inspect_checkpoint(cl.files[0]);
    } else if (cl.command == "export") {
      if (rank == 0 && cl.files[1] == "llmc") pdtrain::export_llmc(cl.files[0], cl.files[2]);
      if (rank == 0 && cl.files[1] == "hf") pdtrain::export_hf(cl.files[0], cl.files[2]);
    } else if (cl.command == "sample") {
      if (rank == 0) pdtrain::sample_checkpoint(cl.sample);
    } else if (!cl.help && !cl.version && !cl.print_default && !cl.print_reference) {
      if (cl.plan.calibrate.empty()) deck = load(cl, &listing);
      pdtrain::connect_plan_to_training(cl.plan);  // the streamer's bound, the set-up's checks
      if (cl.command == "plan") pdtrain::plan::run_plan(deck, cl.plan, MPI_COMM_WORLD);
      int size = 0;
      MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
      if (cl.command == "eval" && size == 1) run_as_one_process(deck);
    }
  });
  if (cl.command == "plan" && !cl.help && !cl.list_sweep) return 0;
  if (cl.command == "summarize" || cl.command == "inspect" || cl.command == "export" ||
      cl.command == "sample")
    return 0;
  if (cl.list_sweep) {
    if (rank == 0) std::fputs(listing.c_str(), stdout);
    return 0;
  }
  if (cl.help || cl.version || cl.print_default || cl.print_reference) {
    if (rank == 0) {
      if (cl.print_reference) std::fputs(pdtrain::deck_reference_markdown().c_str(), stdout);
      if (cl.help) std::fputs(kUsage, stdout);
      if (cl.version)
        std::printf("pdtrain %s\nbackends: %s\ncomm: mpi%s\n", PDTRAIN_VERSION,
                    pdtrain::kernels::backends_built().c_str(),
                    pdtrain::nccl_built() ? (", nccl " + pdtrain::nccl_version()).c_str() : "");
      if (cl.print_default) std::fputs(pdtrain::default_deck_text(), stdout);
    }
    return 0;
  }
  choose_blas_threads();
  pdtrain::RunOptions opts;
  opts.dry_run = cl.dry_run;
  opts.eval_batches = cl.batches;
  opts.restart = cl.restart;
  opts.stop_after = cl.stop_after;
  pdtrain::install_stop_signals();
  pdtrain::run_training(deck, MPI_COMM_WORLD, opts);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  pdtrain::catch_usr1_from_start();
  pdtrain::init_mpi(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Kokkos::initialize(argc, argv);
  int code = 0;
  try {
    code = run(argc, argv, rank);
  } catch (const pdtrain::Error& e) {
    // A collective error: every rank holds the same message; one prints it, all exit in order.
    // An error only this rank saw: end the whole job now (others may wait on this rank).
    if (!e.collective()) pdtrain::fatal_abort(e.code(), e.what());
    if (rank == 0) std::fprintf(stderr, "pdtrain: error: %s\n", e.what());
    code = static_cast<int>(e.code());
  } catch (const std::exception& e) {
    pdtrain::fatal_abort(pdtrain::ExitCode::runtime, std::string("unexpected error: ") + e.what());
  }
  Kokkos::finalize();
  MPI_Finalize();
  return code;
}
