#include "pdtrain/app/compute_comms.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "pdtrain/app/compute_device.hpp"
#include "pdtrain/core/error.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/mpi_collectives.hpp"
#include "pdtrain/device/host_staging.hpp"
#include "pdtrain/device/nccl_collectives.hpp"
#include "pdtrain/kernels/kernel_ops.hpp"

namespace pdtrain {

namespace {

constexpr std::size_t kUuidBytes = 64;  // room for "GPU-" and 16 bytes in hex, padded

// Why this compute rank cannot use NCCL, and the status a deck asking for it ends with.
std::string reason_against_nccl(const Deck& deck, const std::string& gpu_shared, ExitCode* code) {
  *code = ExitCode::deck;
  if (!nccl_built())
    return "this pdtrain was built without NCCL (configure with -DPDTRAIN_CUDA=ON and a CUDA "
           "toolkit that has NCCL; pdtrain --version lists what was built)";
  if (deck.compute.device == "cpu")
    return "compute.device is \"cpu\": NCCL moves GPU memory (set compute.device = \"cuda\")";
  *code = ExitCode::layout;
  return gpu_shared;
}

}  // namespace

std::string gpu_sharing_on_node(const Setup& setup, const Layout& layout,
                                const std::string& gpu_uuid) {
  std::vector<char> mine(kUuidBytes, '\0');
  gpu_uuid.copy(mine.data(), kUuidBytes - 1);
  const int ranks = static_cast<int>(setup.node.size());
  std::vector<char> all(kUuidBytes * static_cast<std::size_t>(ranks));
  MPI_CHECK(MPI_Allgather(mine.data(), static_cast<int>(kUuidBytes), MPI_CHAR, all.data(),
                          static_cast<int>(kUuidBytes), MPI_CHAR, layout.world()));
  const int me = layout.world_rank();
  if (gpu_uuid.empty()) return "";
  const int node = setup.node[static_cast<std::size_t>(me)];
  int on_node = 0;
  std::vector<std::string> gpus;
  bool shared = false;
  for (int r = setup.shape.holders; r < ranks; ++r) {
    if (setup.node[static_cast<std::size_t>(r)] != node) continue;
    const std::string uuid(all.data() + kUuidBytes * static_cast<std::size_t>(r));
    ++on_node;
    if (std::find(gpus.begin(), gpus.end(), uuid) == gpus.end())
      gpus.push_back(uuid);
    else
      shared = true;
  }
  if (!shared) return "";
  return std::to_string(on_node) + " compute ranks on node " + std::to_string(node) +
         " share its " + std::to_string(gpus.size()) + " GPU(s) (by UUID, e.g. " + gpu_uuid +
         "): NCCL needs a GPU of its own for every compute rank";
}

std::string nccl_unavailable_here(const Deck& deck, const std::string& gpu_shared) {
  if (deck.parallel.comm == "mpi") return "parallel.comm is \"mpi\"";
  ExitCode code = ExitCode::deck;
  const std::string why = reason_against_nccl(deck, gpu_shared, &code);
  if (!why.empty() && deck.parallel.comm == "nccl")
    throw Error(code, deck.where("parallel.comm") + ": nccl, but " + why);
  return why;
}

CommChoice agree_on_comm(const Deck& deck, const Layout& layout, const std::string& why_not_here) {
  int here = why_not_here.empty() ? 1 : 0, everywhere = 0;
  MPI_CHECK(MPI_Allreduce(&here, &everywhere, 1, MPI_INT, MPI_MIN, layout.world()));
  CommChoice c;
  c.nccl = everywhere == 1;
  c.nccl_timeout_s = deck.parallel.nccl_timeout_s;
  const std::string asked = "parallel.comm = " + deck.parallel.comm;
  char watchdog[96];
  std::snprintf(watchdog, sizeof watchdog, "; watchdog: parallel.nccl_timeout_s = %g%s",
                deck.parallel.nccl_timeout_s, deck.parallel.nccl_timeout_s > 0 ? " s" : " (off)");
  const std::string over_nccl = "tp, dp and pp over NCCL on device memory";
  const std::string over_mpi =
      deck.compute.device == "cpu" ? "tp, dp and pp over MPI"
                                   : "tp, dp and pp over MPI through pinned host memory";
  if (c.nccl && layout.is_holder())
    c.why = asked + ": " + over_nccl + " among the compute ranks" + watchdog;  // holders: no NCCL
  else if (c.nccl)
    c.why = asked + ": every compute rank has a GPU of its own: " + over_nccl + "; " +
            pin_deterministic_nccl() + " (NCCL " + nccl_version() + ")" + watchdog;
  else if (deck.parallel.comm == "mpi")
    c.why = asked + ": " + over_mpi;
  else
    c.why = asked + ": " + (here ? "another compute rank cannot use NCCL" : why_not_here) +
            "; " + over_mpi;
  return c;
}

namespace {

// A NCCL communicator over one group of compute ranks: its id made on the group's first rank
// and broadcast within the group's MPI communicator (compute ranks only).
std::unique_ptr<Collectives> nccl_group(MPI_Comm group, Device& device, const char* name,
                                        double stall_limit_s) {
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(group, &rank));
  MPI_CHECK(MPI_Comm_size(group, &size));
  NcclId id{};
  if (rank == 0) id = make_nccl_id();
  MPI_CHECK(MPI_Bcast(id.data(), static_cast<int>(id.size()), MPI_BYTE, 0, group));
  return make_nccl_collectives(device, rank, size, id, name, stall_limit_s);
}

}  // namespace

ComputeComms make_compute_comms(const CommChoice& choice, const Layout& layout, Device& device) {
  ComputeComms c;
  if (choice.nccl) {
    // Every rank makes its groups in the same order (tp, dp, pp), so no group's set-up waits
    // on another's.
    c.tp = nccl_group(layout.tp_comm(), device, "tp", choice.nccl_timeout_s);
    c.dp = nccl_group(layout.dp_comm(), device, "dp", choice.nccl_timeout_s);
    c.pp = nccl_group(layout.pp_comm(), device, "pp", choice.nccl_timeout_s);
    return c;
  }
  c.tp = std::make_unique<MpiCollectives>(layout.tp_comm());
  if (!device.is_host()) c.staged_tp = std::make_unique<StagedTensorParallel>(*c.tp, device);
  c.pp = std::make_unique<MpiCollectives>(layout.pp_comm());
  return c;
}

}  // namespace pdtrain
