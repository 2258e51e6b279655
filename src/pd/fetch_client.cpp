#include "pdtrain/pd/fetch_client.hpp"

#include <cstring>

#include "pdtrain/core/crc32c.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/quiet_wait.hpp"
#include "pdtrain/core/test_hooks.hpp"
#include "pdtrain/pd/wire.hpp"

namespace pdtrain {

FetchClient::FetchClient(const Layout& layout, const BlockTable& table, std::vector<int> owner,
                         WireCodec fetch_codec, WireCodec push_codec, bool fetch_thread)
    : layout_(layout), table_(table), owner_(std::move(owner)), fetch_codec_(fetch_codec),
      push_codec_(push_codec) {
  flip_at_version_ = test_hooks::flip_fetch_bit_at_version().value_or(-1);
  if (relays()) {
    MPI_CHECK(MPI_Comm_dup(layout_.dp_comm(), &relay_comm_));
    const int r = layout_.dp_rank(), dp = layout_.shape().dp;
    for (int c : {2 * r + 1, 2 * r + 2})
      if (c < dp) relay_children_.push_back(c);
  }
  int level = MPI_THREAD_SINGLE;
  MPI_CHECK(MPI_Query_thread(&level));
  if (fetch_thread && level == MPI_THREAD_MULTIPLE) worker_ = std::thread([this] { worker_loop(); });
}

FetchClient::~FetchClient() {
  if (worker_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    worker_.join();
  }
  if (relay_comm_ != MPI_COMM_NULL) MPI_Comm_free(&relay_comm_);
}

std::vector<std::vector<int>> FetchClient::by_holder(const std::vector<int>& blocks) const {
  std::vector<std::vector<int>> out(static_cast<std::size_t>(layout_.shape().holders));
  for (int b : blocks) out[owner_[b]].push_back(b);
  return out;
}

UpdateInfo FetchClient::fetch(std::int64_t version, const std::vector<int>& blocks,
                              const BlockSink& sink) {
  return finish_fetch(start_fetch(version, blocks, sink));
}

// Fan-out: the data-parallel replicas of a (pp, tp) position need the same blocks, so only
// replica 0 asks the holders and relays the replies to the others. A holder sends each block
// once per step whatever dp is.
ParameterService::Ticket FetchClient::start_fetch(std::int64_t version, std::vector<int> blocks,
                                                  BlockSink sink) {
  auto f = std::make_shared<InFlight>();
  f->ticket = next_ticket_++;
  f->version = version;
  f->sink = std::move(sink);
  f->groups = by_holder(blocks);
  f->replies.resize(f->groups.size());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight_.push_back(f);
  }
  if (background())
    changed_.notify_all();
  else
    advance_all();
  return f->ticket;
}

void FetchClient::progress() {
  if (!background()) advance_all();
}

UpdateInfo FetchClient::finish_fetch(Ticket ticket) {
  Job front;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    PDT_CHECK(!in_flight_.empty() && in_flight_.front()->ticket == ticket,
              "fetches must finish in the order they were started");
    front = in_flight_.front();
  }
  if (background()) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return front->delivered; });
  } else {
    Backoff backoff;
    while (!front->delivered) {
      if (advance_all())
        backoff.reset();
      else
        backoff.pause();
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  in_flight_.pop_front();
  return front->info;
}

bool FetchClient::undelivered() const {
  for (const Job& j : in_flight_)
    if (!j->delivered) return true;
  return false;
}

// The background thread: works while fetches are undelivered, sleeps on the condition
// variable otherwise (an idle compute rank does not poll).
void FetchClient::worker_loop() {
  Backoff backoff;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || undelivered(); });
      if (stopping_ && !undelivered()) return;
    }
    if (advance_all())
      backoff.reset();
    else
      backoff.pause();
  }
}

bool FetchClient::advance_all() {
  std::vector<Job> jobs;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Job& j : in_flight_)
      if (!j->delivered) jobs.push_back(j);
  }
  bool moved = false;
  for (const Job& j : jobs)
    if (j->stage == InFlight::Stage::created) {
      if (layout_.dp_rank() == 0)
        send_requests(*j);
      else
        j->stage = InFlight::Stage::relay_recv;
      moved = true;
    }
  if (layout_.dp_rank() == 0) moved = receive_replies(jobs) || moved;
  // Relays go in ticket order: a fetch advances only once the one before it has received all
  // of its replies (and so has posted its sends to the children).
  for (const Job& j : jobs) {
    moved = advance(*j) || moved;
    if (j->stage == InFlight::Stage::relay_recv || j->stage == InFlight::Stage::awaiting_replies)
      break;
  }
  // Deliver in order.
  for (const Job& j : jobs) {
    if (j->stage != InFlight::Stage::ready) break;
    const UpdateInfo info = verify_and_deliver(*j);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      j->info = info;
      j->delivered = true;
    }
    changed_.notify_all();
    moved = true;
  }
  return moved;
}

void FetchClient::send_requests(InFlight& f) {
  const int H = static_cast<int>(f.groups.size());
  f.requests.resize(H);
  for (int h = 0; h < H; ++h) {
    if (f.groups[h].empty()) continue;
    const wire::FetchRequest fr{f.version, static_cast<std::int64_t>(f.groups[h].size()),
                                f.ticket};
    std::vector<char>& m = f.requests[h];
    m.resize(sizeof(fr) + f.groups[h].size() * sizeof(std::int32_t));
    std::memcpy(m.data(), &fr, sizeof(fr));
    std::memcpy(m.data() + sizeof(fr), f.groups[h].data(),
                f.groups[h].size() * sizeof(std::int32_t));
    f.sends.emplace_back();
    MPI_CHECK(MPI_Isend(m.data(), static_cast<int>(m.size()), MPI_BYTE,
                        layout_.holder_world_rank(h), wire::kFetchRequest, layout_.world(),
                        &f.sends.back()));
    ++f.awaited_replies;
  }
  f.stage = InFlight::Stage::awaiting_replies;
}

// Takes every reply that has arrived, whatever fetch it answers (its header names the ticket).
// Replies are as long as their encoding: each is sized from its probe.
bool FetchClient::receive_replies(const std::vector<Job>& jobs) {
  bool got = false;
  for (;;) {
    int flag = 0;
    MPI_Message m;
    MPI_Status st;
    MPI_CHECK(MPI_Improbe(MPI_ANY_SOURCE, wire::kFetchReply, layout_.world(), &flag, &m, &st));
    if (!flag) return got;
    got = true;
    int bytes = 0;
    MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &bytes));
    Buffer r = take_buffer(static_cast<std::size_t>(bytes));
    MPI_CHECK(MPI_Mrecv(r.data.get(), bytes, MPI_BYTE, &m, MPI_STATUS_IGNORE));
    from_holders_ += bytes;
    PDT_CHECK(r.size >= sizeof(wire::ReplyHeader),
              "short fetch reply from rank " + std::to_string(st.MPI_SOURCE));
    wire::ReplyHeader rh;
    std::memcpy(&rh, r.data.get(), sizeof(rh));
    InFlight* f = nullptr;
    for (const Job& g : jobs)
      if (g->ticket == rh.ticket) f = g.get();
    PDT_CHECK(f != nullptr && f->stage == InFlight::Stage::awaiting_replies,
              "holder rank " + std::to_string(st.MPI_SOURCE) + " answered unknown fetch " +
                  std::to_string(rh.ticket));
    f->replies[st.MPI_SOURCE] = std::move(r);  // holders are world ranks 0..H-1
    --f->awaited_replies;
  }
}

bool FetchClient::advance(InFlight& f) {
  using S = InFlight::Stage;
  const S before = f.stage;
  bool received = false;
  if (f.stage == S::awaiting_replies) {
    if (f.awaited_replies > 0) return false;
    int sent = 0;
    MPI_CHECK(MPI_Testall(static_cast<int>(f.sends.size()), f.sends.data(), &sent,
                          MPI_STATUSES_IGNORE));
    if (!sent) return false;
    f.stage = relays() ? S::relay_send : S::ready;
  }
  if (f.stage == S::relay_recv) {  // from the parent, one message per holder in holder order
    const int parent = (layout_.dp_rank() - 1) / 2;
    while (f.next_group < f.groups.size()) {
      if (f.groups[f.next_group].empty()) {
        ++f.next_group;
        continue;
      }
      int flag = 0;
      MPI_Message m;
      MPI_Status st;
      MPI_CHECK(MPI_Improbe(parent, wire::kRelay, relay_comm_, &flag, &m, &st));
      if (!flag) return received;
      int bytes = 0;
      MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &bytes));
      Buffer& r = f.replies[f.next_group];
      r = take_buffer(static_cast<std::size_t>(bytes));
      MPI_CHECK(MPI_Mrecv(r.data.get(), bytes, MPI_BYTE, &m, MPI_STATUS_IGNORE));
      ++f.next_group;
      received = true;
    }
    f.stage = S::relay_send;
  }
  if (f.stage == S::relay_send) {
    if (!f.relay_posted) {
      for (int child : relay_children_)
        for (std::size_t h = 0; h < f.groups.size(); ++h) {
          if (f.groups[h].empty()) continue;
          f.relay_reqs.emplace_back();
          MPI_CHECK(MPI_Isend(f.replies[h].data.get(), static_cast<int>(f.replies[h].size),
                              MPI_BYTE, child, wire::kRelay, relay_comm_, &f.relay_reqs.back()));
        }
      f.relay_posted = true;
    }
    int done = 0;
    MPI_CHECK(MPI_Testall(static_cast<int>(f.relay_reqs.size()), f.relay_reqs.data(), &done,
                          MPI_STATUSES_IGNORE));
    if (done) f.stage = S::ready;
  }
  return received || f.stage != before;
}

UpdateInfo FetchClient::verify_and_deliver(InFlight& f) {
  const std::int64_t version = f.version;
  bool stop = false;
  std::vector<UpdateInfo> learnt;
  for (int h = 0; h < static_cast<int>(f.groups.size()); ++h) {
    const std::vector<int>& group = f.groups[h];
    if (group.empty()) continue;
    char* reply = f.replies[h].data.get();
    wire::ReplyHeader rh;
    std::memcpy(&rh, reply, sizeof(rh));
    PDT_CHECK(rh.version == version && rh.ticket == f.ticket,
              "holder " + std::to_string(h) + " answered with version " +
                  std::to_string(rh.version) + " for a fetch of version " +
                  std::to_string(version));
    stop = stop || rh.stop != 0;
    for (std::int64_t i = 0; i < rh.n_recent && i < wire::kMaxRecentUpdates; ++i)
      learnt.push_back(UpdateInfo{rh.recent[i].version, rh.recent[i].grad_norm, rh.recent[i].lr});
    const char* hdr = reply + sizeof(rh);
    char* data = reply + sizeof(rh) + group.size() * sizeof(wire::BlockHeader);
    if (version == flip_at_version_) {
      data[0] ^= 0x10;
      flip_at_version_ = -1;
    }
    for (std::size_t i = 0; i < group.size(); ++i) {
      wire::BlockHeader bh;
      std::memcpy(&bh, hdr + i * sizeof(bh), sizeof(bh));
      const int b = group[i];
      const BlockDesc& d = table_.blocks[b];
      PDT_CHECK(bh.id == b && bh.version == version,
                "block " + d.name + " arrived as id " + std::to_string(bh.id) + " version " +
                    std::to_string(bh.version) + ", expected version " + std::to_string(version));
      const auto nb = static_cast<std::size_t>(bh.bytes);
      PDT_CHECK(crc32c(data, nb) == bh.crc,
                "CRC mismatch in block " + d.name + " (version " + std::to_string(version) +
                    ") fetched from holder " + std::to_string(h));
      if (fetch_codec_ == WireCodec::raw &&
          reinterpret_cast<std::uintptr_t>(data) % alignof(float) == 0) {
        // Raw floats are used where they arrived (the buffer outlives the sink call).
        PDT_CHECK(nb == static_cast<std::size_t>(d.numel) * sizeof(float),
                  "block " + d.name + " arrived with " + std::to_string(nb) + " bytes");
        f.sink(b, reinterpret_cast<const float*>(data));
      } else {
        decoded_.resize(static_cast<std::size_t>(d.numel));
        PDT_CHECK(wire_decode(fetch_codec_, data, nb, decoded_.data(), d.numel),
                  std::string("cannot decode (") + to_string(fetch_codec_) + ") block " + d.name);
        f.sink(b, decoded_.data());
      }
      data += nb;
      fetched_ += static_cast<std::int64_t>(nb);
    }
  }
  for (Buffer& r : f.replies)
    if (r.capacity > 0) spare_.push_back(std::move(r));
  if (stop) stop_ = true;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const UpdateInfo& u : learnt) known_[u.version] = u;
  return known_.count(version) ? known_.at(version) : UpdateInfo{version, 0.0, 0.0};
}

// The smallest spare buffer that fits (or a new one); at most a few are kept.
FetchClient::Buffer FetchClient::take_buffer(std::size_t bytes) {
  std::size_t best = spare_.size();
  for (std::size_t i = 0; i < spare_.size(); ++i)
    if (spare_[i].capacity >= bytes &&
        (best == spare_.size() || spare_[i].capacity < spare_[best].capacity))
      best = i;
  Buffer b;
  if (best < spare_.size()) {
    b = std::move(spare_[best]);
    spare_.erase(spare_.begin() + static_cast<std::ptrdiff_t>(best));
  }
  while (spare_.size() > 8) spare_.erase(spare_.begin());
  b.resize(bytes);
  return b;
}

std::optional<UpdateInfo> FetchClient::update_info(std::int64_t version) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = known_.find(version);
  if (it == known_.end()) return std::nullopt;
  return it->second;
}

void FetchClient::push(std::int64_t step, const std::vector<int>& blocks, const float* grads) {
  wait_push(start_push(step, blocks, grads));
}

ParameterService::PushTicket FetchClient::start_push(std::int64_t step,
                                                     const std::vector<int>& blocks,
                                                     const float* grads) {
  const auto groups = by_holder(blocks);
  // Offsets of each block's gradient inside `grads` (packed in the order of `blocks`).
  std::vector<const float*> where(table_.blocks.size(), nullptr);
  const float* p = grads;
  for (int b : blocks) {
    where[b] = p;
    p += table_.blocks[b].numel;
  }
  // One message per holder: headers, then each block's payload. Raw payloads are sent from
  // where they are (an hindexed datatype); other codecs encode into the message.
  const PushTicket ticket = next_push_ticket_++;
  Pushing& out = pushes_[ticket];
  out.ticket = ticket;
  for (int h = 0; h < static_cast<int>(groups.size()); ++h) {
    if (groups[h].empty()) continue;
    const std::size_t head =
        sizeof(wire::PushHeader) + groups[h].size() * sizeof(wire::BlockHeader);
    std::vector<char>& m = out.bytes.emplace_back();
    std::vector<MPI_Aint> at;
    std::vector<int> len;
    std::int64_t numel = 0;
    for (int b : groups[h]) numel += table_.blocks[b].numel;
    m.reserve(head + (push_codec_ == WireCodec::raw ? 0 : static_cast<std::size_t>(numel) * 4));
    m.resize(head);
    const wire::PushHeader ph{step, static_cast<std::int64_t>(groups[h].size())};
    std::memcpy(m.data(), &ph, sizeof(ph));
    for (std::size_t i = 0; i < groups[h].size(); ++i) {
      const int b = groups[h][i];
      wire::BlockHeader bh{b, 0, step, 0};
      if (push_codec_ == WireCodec::raw) {
        bh.bytes = table_.blocks[b].numel * static_cast<std::int64_t>(sizeof(float));
        bh.crc = crc32c(where[b], static_cast<std::size_t>(bh.bytes));
        at.emplace_back();
        MPI_CHECK(MPI_Get_address(where[b], &at.back()));
        len.push_back(static_cast<int>(bh.bytes));
      } else {
        const std::size_t from = m.size();
        bh.bytes = static_cast<std::int64_t>(
            wire_encode(push_codec_, where[b], table_.blocks[b].numel, m));
        bh.crc = crc32c(m.data() + from, static_cast<std::size_t>(bh.bytes));
      }
      std::memcpy(m.data() + sizeof(ph) + i * sizeof(bh), &bh, sizeof(bh));
      pushed_ += bh.bytes;
    }
    at.insert(at.begin(), 0);
    MPI_CHECK(MPI_Get_address(m.data(), &at.front()));
    len.insert(len.begin(), static_cast<int>(m.size()));
    MPI_Datatype& type = out.types.emplace_back();
    MPI_CHECK(MPI_Type_create_hindexed(static_cast<int>(at.size()), len.data(), at.data(),
                                       MPI_BYTE, &type));
    MPI_CHECK(MPI_Type_commit(&type));
    MPI_CHECK(MPI_Isend(MPI_BOTTOM, 1, type, layout_.holder_world_rank(h), wire::kPush,
                        layout_.world(), &out.requests.emplace_back()));
  }
  return ticket;
}

std::map<ParameterService::PushTicket, FetchClient::Pushing>::iterator FetchClient::pushing(
    PushTicket ticket) {
  auto it = pushes_.find(ticket);
  PDT_CHECK(it != pushes_.end(), "unknown push " + std::to_string(ticket));
  return it;
}

void FetchClient::free_push(std::map<PushTicket, Pushing>::iterator it) {
  for (MPI_Datatype& t : it->second.types) MPI_CHECK(MPI_Type_free(&t));
  pushes_.erase(it);
}

bool FetchClient::push_done(PushTicket ticket) {
  auto it = pushing(ticket);
  int done = 0;
  MPI_CHECK(MPI_Testall(static_cast<int>(it->second.requests.size()), it->second.requests.data(),
                        &done, MPI_STATUSES_IGNORE));
  if (done) free_push(it);
  return done != 0;
}

void FetchClient::wait_push(PushTicket ticket) {
  auto it = pushing(ticket);
  wait_all_quietly(static_cast<int>(it->second.requests.size()), it->second.requests.data());
  free_push(it);
}

std::uint32_t FetchClient::finish() {
  std::int64_t none = 0;
  for (int h = 0; h < layout_.shape().holders; ++h)
    MPI_CHECK(MPI_Send(&none, 1, MPI_INT64_T, layout_.holder_world_rank(h), wire::kDone,
                       layout_.world()));
  if (!layout_.is_reporter()) return 0;
  std::uint32_t crc = 0;
  MPI_Request r;
  MPI_CHECK(MPI_Irecv(&crc, 1, MPI_UINT32_T, layout_.holder_world_rank(0), wire::kFinalCrc,
                      layout_.world(), &r));
  wait_quietly(&r);
  return crc;
}

}  // namespace pdtrain
