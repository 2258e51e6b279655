// pdtrain: trains a GPT model with parameters held by holder ranks and compute on compute ranks.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "pdtrain/app/train.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/kernels/blas_runtime.hpp"
#include "pdtrain/version.hpp"

namespace {

const char* kUsage =
    "usage: pdtrain [DECK.toml] [--set section.key=value]... [--dry-run]\n"
    "               [--print-default-deck] [--help] [--version]\n"
    "       pdtrain eval [DECK.toml] [--set section.key=value]... --batches N\n"
    "\n"
    "Trains a GPT-2 model. Without DECK, runs the embedded default deck (input/default.toml).\n"
    "Launch with MPI, e.g.  mpirun -np 3 pdtrain   (1 parameter holder + 2 compute ranks).\n"
    "\n"
    "eval: the mean loss of the initial model (model.init) over the first N consecutive,\n"
    "      non-overlapping windows of data.path, each train.batch_size x model.seq_len tokens\n"
    "      with targets shifted by one (llm.c's validation loss).\n"
    "\n"
    "  --set k=v             override a deck key (checked like the deck), repeatable\n"
    "  --dry-run             print each rank's role, coordinates and blocks, then exit\n"
    "  --print-default-deck  print the embedded default deck and exit\n"
    "  --print-deck-reference  print every deck key as Markdown (docs/deck.md) and exit\n"
    "  --help, --version\n"
    "\n"
    "Exit status: 0 ok, 1 runtime fault, 2 bad deck or command line, 3 impossible layout,\n"
    "4 bad data file. Deck keys: docs/deck.md.\n";

struct CommandLine {
  std::string command = "train";  // train | eval
  std::int64_t batches = 0;       // eval: windows to evaluate
  std::string deck_path;  // empty: the embedded default deck
  std::vector<std::string> sets;
  bool dry_run = false, help = false, version = false, print_default = false;
  bool print_reference = false;
};

CommandLine parse_command_line(int argc, char** argv) {
  CommandLine c;
  int first = 1;
  if (argc > 1 && std::string(argv[1]) == "eval") c.command = "eval", first = 2;
  for (int i = first; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--batches" && c.command == "eval") {
      if (i + 1 >= argc) throw pdtrain::Error(pdtrain::ExitCode::deck, "--batches needs a count");
      char* end = nullptr;
      c.batches = std::strtoll(argv[++i], &end, 10);
      if (*end != '\0' || c.batches < 1)
        throw pdtrain::Error(pdtrain::ExitCode::deck,
                             std::string("--batches must be a positive integer, got '") +
                                 argv[i] + "'");
    } else if (a == "--set") {
      if (i + 1 >= argc) throw pdtrain::Error(pdtrain::ExitCode::deck, "--set needs section.key=value");
      c.sets.push_back(argv[++i]);
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

int run(int argc, char** argv, int rank) {
  std::unique_ptr<pdtrain::Error> err;
  CommandLine cl;
  pdtrain::Deck deck;
  try {
    cl = parse_command_line(argc, argv);
    if (!cl.help && !cl.version && !cl.print_default && !cl.print_reference)
      deck = cl.deck_path.empty()
                 ? pdtrain::parse_deck(pdtrain::default_deck_text(), "<default deck>", cl.sets)
                 : pdtrain::load_deck(cl.deck_path, cl.sets);
  } catch (const pdtrain::Error& e) {
    err = std::make_unique<pdtrain::Error>(e);
  }
  pdtrain::rethrow_collectively(MPI_COMM_WORLD, err.get());
  if (cl.help || cl.version || cl.print_default || cl.print_reference) {
    if (rank == 0) {
      if (cl.print_reference) std::fputs(pdtrain::deck_reference_markdown().c_str(), stdout);
      if (cl.help) std::fputs(kUsage, stdout);
      if (cl.version) std::printf("pdtrain %s\n", PDTRAIN_VERSION);
      if (cl.print_default) std::fputs(pdtrain::default_deck_text(), stdout);
    }
    return 0;
  }
  choose_blas_threads();
  pdtrain::RunOptions opts;
  opts.dry_run = cl.dry_run;
  opts.eval_batches = cl.batches;
  pdtrain::run_training(deck, MPI_COMM_WORLD, opts);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Kokkos::initialize(argc, argv);
  int code = 0;
  try {
    code = run(argc, argv, rank);
  } catch (const pdtrain::Error& e) {
    // Collective errors: every rank holds the same message; one prints it.
    if (rank == 0) std::fprintf(stderr, "pdtrain: error: %s\n", e.what());
    code = static_cast<int>(e.code());
  }
  Kokkos::finalize();
  MPI_Finalize();
  return code;
}
