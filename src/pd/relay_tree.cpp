#include "pdtrain/pd/relay_tree.hpp"

#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/pd/wire.hpp"

namespace pdtrain {

RelayTree::RelayTree(const Layout& layout) {
  const int r = layout.dp_rank(), dp = layout.shape().dp;
  if (dp <= 1) return;
  MPI_CHECK(MPI_Comm_dup(layout.dp_comm(), &comm_));
  parent_ = r > 0 ? (r - 1) / 2 : -1;
  for (int c : {2 * r + 1, 2 * r + 2})
    if (c < dp) children_.push_back(c);
}

RelayTree::~RelayTree() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

bool RelayTree::receive(const std::function<ByteBuffer&(std::size_t bytes)>& buffer_for) {
  int flag = 0;
  MPI_Message m;
  MPI_Status st;
  MPI_CHECK(MPI_Improbe(parent_, wire::kRelay, comm_, &flag, &m, &st));
  if (!flag) return false;
  int bytes = 0;
  MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &bytes));
  ByteBuffer& into = buffer_for(static_cast<std::size_t>(bytes));
  MPI_CHECK(MPI_Mrecv(into.data.get(), bytes, MPI_BYTE, &m, MPI_STATUS_IGNORE));
  return true;
}

void RelayTree::forward(const ByteBuffer& reply, std::vector<MPI_Request>& sends) const {
  for (int child : children_)
    MPI_CHECK(MPI_Isend(reply.data.get(), static_cast<int>(reply.size), MPI_BYTE, child,
                        wire::kRelay, comm_, &sends.emplace_back()));
}

}  // namespace pdtrain
