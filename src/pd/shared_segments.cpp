#include "pdtrain/pd/shared_segments.hpp"

#include <sys/statvfs.h>

#include <cstdint>
#include <cstdlib>
#include <exception>

#include "pdtrain/core/mpi_check.hpp"

namespace pdtrain {

std::string shared_memory_directory() {
  const char* dir = std::getenv("OMPI_MCA_osc_sm_backing_directory");
  return dir && *dir ? dir : "/dev/shm";
}

namespace {

// Free bytes of the backing directory; 0 when it cannot be read.
std::uint64_t free_bytes(const std::string& dir) {
  struct statvfs st{};
  if (statvfs(dir.c_str(), &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize;
}

// The world ranks of `node`'s ranks, by node rank.
std::vector<int> world_ranks_of(MPI_Comm node, MPI_Comm world) {
  const int n = comm_size(node);
  std::vector<int> node_ranks(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) node_ranks[static_cast<std::size_t>(i)] = i;
  MPI_Group node_group, world_group;
  MPI_CHECK(MPI_Comm_group(node, &node_group));
  MPI_CHECK(MPI_Comm_group(world, &world_group));
  MPI_CHECK(MPI_Group_translate_ranks(node_group, n, node_ranks.data(), world_group, out.data()));
  MPI_CHECK(MPI_Group_free(&node_group));
  MPI_CHECK(MPI_Group_free(&world_group));
  return out;
}

}  // namespace

std::unique_ptr<SharedSegments> SharedSegments::create(MPI_Comm world, std::size_t my_bytes,
                                                       std::string* why_not, int node_id) {
  MPI_Comm memory = MPI_COMM_NULL, node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &memory));
  MPI_CHECK(MPI_Comm_split(memory, node_id, 0, &node));
  MPI_CHECK(MPI_Comm_free(&memory));
  MPI_CHECK(MPI_Comm_set_errhandler(node, MPI_ERRORS_RETURN));
  // A tmpfs without room would end the job with SIGBUS on the first write past its limit:
  // check each node's total against its directory first, and agree.
  std::uint64_t node_bytes = my_bytes;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &node_bytes, 1, MPI_UINT64_T, MPI_SUM, node));
  const std::string dir = shared_memory_directory();
  const std::uint64_t room = free_bytes(dir);
  std::int64_t short_by = node_bytes > room ? static_cast<std::int64_t>(node_bytes - room) : 0;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &short_by, 1, MPI_INT64_T, MPI_MAX, world));
  if (short_by > 0) {
    if (why_not)
      *why_not = "a node's " + dir + " lacks " + std::to_string(short_by >> 20) +
                 " MiB for the holders' shared segments";
    MPI_CHECK(MPI_Comm_free(&node));
    return nullptr;
  }
  std::unique_ptr<SharedSegments> s(new SharedSegments());
  s->node_ = node;
  s->my_bytes_ = my_bytes;
  const std::vector<int> node_members = world_ranks_of(node, world);
  s->segments_.assign(static_cast<std::size_t>(comm_size(world)), nullptr);
  s->sizes_.assign(s->segments_.size(), 0);
  s->on_node_.assign(s->segments_.size(), 0);
  for (int r : node_members) s->on_node_[static_cast<std::size_t>(r)] = 1;
  if (node_bytes == 0) return s;  // no holder here: nothing to map (the whole node agrees)
  // Each rank's segment apart (not one contiguous window): a holder's pages then lie in its
  // own NUMA domain, touched first by its own update.
  MPI_Info info = MPI_INFO_NULL;
  MPI_CHECK(MPI_Info_create(&info));
  MPI_CHECK(MPI_Info_set(info, "alloc_shared_noncontig", "true"));
  void* base = nullptr;
  MPI_CHECK(MPI_Win_allocate_shared(static_cast<MPI_Aint>(my_bytes), 1, info, node, &base,
                                    &s->win_));
  MPI_CHECK(MPI_Info_free(&info));
  s->mine_ = my_bytes > 0 ? static_cast<char*>(base) : nullptr;
  MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, s->win_));
  for (std::size_t i = 0; i < node_members.size(); ++i) {
    MPI_Aint size = 0;
    int unit = 0;
    void* at = nullptr;
    MPI_CHECK(MPI_Win_shared_query(s->win_, static_cast<int>(i), &size, &unit, &at));
    if (size <= 0) continue;
    const auto r = static_cast<std::size_t>(node_members[i]);
    s->segments_[r] = static_cast<const char*>(at);
    s->sizes_[r] = static_cast<std::size_t>(size);
  }
  return s;
}

SharedSegments::~SharedSegments() {
  if (std::uncaught_exceptions() > 0) return;
  if (win_ != MPI_WIN_NULL) {
    MPI_Win_unlock_all(win_);
    MPI_Win_free(&win_);
  }
  MPI_Comm_free(&node_);
}

void SharedSegments::sync() const {
  if (win_ != MPI_WIN_NULL) MPI_CHECK(MPI_Win_sync(win_));
}

}  // namespace pdtrain
