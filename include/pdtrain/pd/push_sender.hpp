#pragma once
// The push protocol of a compute rank: a step's gradients to the holders that own them, per
// holder a header message (wire::kPush: ids, steps, sizes, CRC32Cs) and one contiguous payload
// message (wire::kPushPayload), so the holder copies it in itself while this rank computes.
// Raw gradients that lie back to back are sent from where they are, others packed or encoded;
// with `describe`, raw tiles that are apart go as one datatype over them instead.
#include <mpi.h>

#include <cstdint>
#include <map>
#include <vector>

#include "pdtrain/core/block_place.hpp"
#include "pdtrain/layout/layout.hpp"
#include "pdtrain/pd/blocks.hpp"
#include "pdtrain/pd/wire_codec.hpp"

namespace pdtrain {

class PushSender {
 public:
  using Ticket = std::int64_t;
  PushSender(const Layout& layout, const BlockTable& table, const std::vector<int>& owner,
             WireCodec codec);
  PushSender(const PushSender&) = delete;
  PushSender& operator=(const PushSender&) = delete;

  // Starts the push of blocks[i]'s gradient (fp32) of 1-based step `step` from places[i];
  // the memory must stay unchanged until done() or wait().
  Ticket start(std::int64_t step, const std::vector<int>& blocks,
               const std::vector<ConstBlockPlace>& places, bool describe);
  bool done(Ticket ticket);  // also frees it when done
  void wait(Ticket ticket);
  std::int64_t bytes_pushed() const { return pushed_; }

 private:
  // One push on its way: per holder with blocks, a header and a payload message, kept until
  // the sends complete.
  struct Pushing {
    std::vector<std::vector<char>> headers, payloads;
    std::vector<MPI_Request> requests;
    std::vector<MPI_Datatype> described;  // payloads sent as datatypes over their tiles
  };
  static MPI_Datatype tiles_type(const std::vector<const ConstBlockPlace*>& tiles);
  std::map<Ticket, Pushing>::iterator pushing(Ticket ticket);
  void free_push(std::map<Ticket, Pushing>::iterator it);

  const Layout& layout_;
  const BlockTable& table_;
  const std::vector<int>& owner_;
  WireCodec codec_;
  std::map<Ticket, Pushing> pushes_;  // on their way (compute thread only)
  Ticket next_ticket_ = 0;
  std::int64_t pushed_ = 0;
};

}  // namespace pdtrain
