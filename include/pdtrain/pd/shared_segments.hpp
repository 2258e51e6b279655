#pragma once
// Holders' published blocks in memory the ranks of their node map: one MPI shared-memory window
// per node (MPI_Win_allocate_shared over MPI_COMM_TYPE_SHARED), one segment per rank (compute
// ranks' are empty). A compute rank on a holder's node copies a fetched block straight from the
// holder's segment into its place and takes the CRC32C in the same pass (crc32c_copy): one pass
// over the bytes, where a message took MPI's copy and then a second pass to check it. Requests
// and replies still travel as messages (a reply names where each block lies); only the payloads
// stay put. Holders off the node are fetched from by message as before.
//
// Why no lock guards a block: a holder rewrites the slot of version v only in the update of
// step v + s + 1, which needs every compute rank's gradients of that step, the last step
// computed on version v; a compute rank copies a block when the reply arrives, before it uses
// it and so before it pushes that step's gradients (the same argument lets a reply's send
// buffer be reused, HolderServer::finish_step).
#include <mpi.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace pdtrain {

class SharedSegments {
 public:
  // Collective over `world`: each rank gives the bytes of its own segment and the node the
  // job places it on (`node`: ranks share segments only when they share memory and `node`;
  // the tests fake several nodes on one). Null on every rank (with `why_not` saying why, the
  // same text everywhere) when some node's backing directory has too little room for its
  // segments; the job then fetches by message.
  static std::unique_ptr<SharedSegments> create(MPI_Comm world, std::size_t my_bytes,
                                                std::string* why_not, int node = 0);
  // Collective over the node (MPI_Win_free), except while an error unwinds: the job is ending
  // then and other ranks may never get here.
  ~SharedSegments();
  SharedSegments(const SharedSegments&) = delete;
  SharedSegments& operator=(const SharedSegments&) = delete;

  char* mine() const { return mine_; }
  std::size_t my_bytes() const { return my_bytes_; }
  // The segment of world rank `r` when it lies on this node, else null (also when it is empty).
  const char* of(int r) const { return segments_[static_cast<std::size_t>(r)]; }
  // The bytes of world rank `r`'s segment as mapped here (0 when of(r) is null).
  std::size_t size_of(int r) const { return sizes_[static_cast<std::size_t>(r)]; }
  bool on_node(int r) const { return on_node_[static_cast<std::size_t>(r)] != 0; }
  // Orders this rank's writes to shared memory before its later messages, and its reads after
  // its earlier ones (MPI_Win_sync; the window stays in one passive-target epoch).
  void sync() const;

 private:
  SharedSegments() = default;
  MPI_Comm node_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  char* mine_ = nullptr;
  std::size_t my_bytes_ = 0;
  std::vector<const char*> segments_;  // by world rank
  std::vector<std::size_t> sizes_;     // by world rank
  std::vector<char> on_node_;          // by world rank
};

// Where Open MPI puts a shared window's backing file (osc_sm_backing_directory, /dev/shm by
// default); its free bytes decide whether the segments fit.
std::string shared_memory_directory();

}  // namespace pdtrain
