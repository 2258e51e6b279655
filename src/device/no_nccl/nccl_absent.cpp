// A build without NCCL (CPU-only, or a CUDA toolkit without NCCL): compute-to-compute traffic
// goes over MPI, and asking for NCCL is a clear error.
#include "pdtrain/core/error.hpp"
#include "pdtrain/device/nccl_collectives.hpp"

namespace pdtrain {

bool nccl_built() { return false; }
std::string nccl_version() { return ""; }

namespace {
[[noreturn]] void no_nccl() {
  throw Error(ExitCode::runtime,
              "this pdtrain was built without NCCL (configure with -DPDTRAIN_CUDA=ON and a CUDA "
              "toolkit that has NCCL)");
}
}  // namespace

NcclId make_nccl_id() { no_nccl(); }
std::string pin_deterministic_nccl() { no_nccl(); }
std::unique_ptr<Collectives> make_nccl_collectives(Device&, int, int, const NcclId&,
                                                   const std::string&, double) {
  no_nccl();
}

}  // namespace pdtrain
