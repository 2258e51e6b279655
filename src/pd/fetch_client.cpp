#include "pdtrain/pd/fetch_client.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

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
  return start_fetch_in_place(version, std::move(blocks), std::move(sink), BlockTarget{});
}

ParameterService::Ticket FetchClient::start_fetch_in_place(std::int64_t version,
                                                           std::vector<int> blocks,
                                                           BlockSink sink, BlockTarget target) {
  auto f = std::make_shared<InFlight>();
  f->ticket = next_ticket_++;
  f->version = version;
  f->sink = std::move(sink);
  f->target = std::move(target);
  f->groups = by_holder(blocks);
  f->replies.resize(f->groups.size());
  f->landings.resize(f->groups.size());
  f->replied.assign(f->groups.size(), 0);
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
      prepare_landings(*j);  // here, on the thread that moves fetches (it owns the buffers)
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

int FetchClient::wire_width() const {
  switch (fetch_codec_) {
    case WireCodec::raw: return 4;
    case WireCodec::bf16: return 2;
    default: return 0;
  }
}

// Typed landings for the holders' groups where the target places at least one block. Not with
// data-parallel relays: a reply relayed from one contiguous buffer and received into one lets
// Open MPI's shared-memory transport move it with a single copy (CMA) that the receiver makes
// alone; a datatype on either side turns that into 32 KiB fragments that advance only when the
// sending replica polls, which a compute rank without the fetch thread does once per layer.
// (A holder's reply is a datatype anyway, so receiving it in place costs nothing of the kind.)
void FetchClient::prepare_landings(InFlight& f) {
  if (!f.target || wire_width() == 0 || relays()) return;
  for (std::size_t h = 0; h < f.groups.size(); ++h)
    if (!f.groups[h].empty()) build_landing(f.groups[h], f.target, f.replies[h], f.landings[h]);
}

// The reply's layout is known: headers, then each block's numel * width bytes in request order.
// Placed payloads go to their tiles (a strided hvector where a tile's rows are apart, e.g. a
// column slab of a row-parallel weight); the headers and unplaced payloads to `reply`.
void FetchClient::build_landing(const std::vector<int>& group, const BlockTarget& target,
                                Buffer& reply, Landing& l) {
  const int w = wire_width();
  const std::size_t head = sizeof(wire::ReplyHeader) + group.size() * sizeof(wire::BlockHeader);
  std::size_t side = 0, payload = 0;
  l.at.resize(group.size());
  l.in_place.assign(group.size(), 0);
  for (std::size_t i = 0; i < group.size(); ++i) {
    const std::int64_t nb = table_.blocks[group[i]].numel * w;
    const BlockPlace p = target.place(group[i], w);
    if (p.data != nullptr) {
      PDT_CHECK(p.bytes() == nb, "block " + table_.blocks[group[i]].name + " placed in " +
                                     std::to_string(p.bytes()) + " bytes, expected " +
                                     std::to_string(nb));
      l.at[i] = p;
      l.in_place[i] = 1;
    } else {
      l.at[i] = BlockPlace{nullptr, 1, nb, nb};
      side += static_cast<std::size_t>(nb);
    }
    payload += static_cast<std::size_t>(nb);
  }
  if (std::find(l.in_place.begin(), l.in_place.end(), 1) == l.in_place.end()) {
    l = Landing{};  // nothing placed: the reply is received as bytes
    return;
  }
  reply = take_buffer(head + side);
  char* next = reply.data.get() + head;
  for (std::size_t i = 0; i < group.size(); ++i)
    if (!l.in_place[i]) l.at[i].data = next, next += l.at[i].bytes();
  l.type = landing_type(reply.data.get(), head, l.at);
  l.bytes = head + payload;
}

// One datatype over absolute addresses: the headers at `head_at`, then each payload's tile (an
// hvector of rows where they are apart).
MPI_Datatype FetchClient::landing_type(const char* head_at, std::size_t head,
                                       const std::vector<BlockPlace>& at) {
  std::vector<int> lengths;
  std::vector<MPI_Aint> where;
  std::vector<MPI_Datatype> types, strided;
  auto add = [&](const char* p, std::int64_t n, MPI_Datatype t) {
    where.emplace_back();
    MPI_CHECK(MPI_Get_address(p, &where.back()));
    lengths.push_back(static_cast<int>(n));
    types.push_back(t);
  };
  add(head_at, static_cast<std::int64_t>(head), MPI_BYTE);
  for (const BlockPlace& p : at) {
    if (p.bytes() == 0) continue;  // the holder sends nothing for it either
    if (p.contiguous()) {
      add(p.data, p.bytes(), MPI_BYTE);
      continue;
    }
    strided.emplace_back();
    MPI_CHECK(MPI_Type_create_hvector(static_cast<int>(p.rows), static_cast<int>(p.row_bytes),
                                      p.stride_bytes, MPI_BYTE, &strided.back()));
    add(p.data, 1, strided.back());
  }
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_CHECK(MPI_Type_create_struct(static_cast<int>(where.size()), lengths.data(), where.data(),
                                   types.data(), &type));
  MPI_CHECK(MPI_Type_commit(&type));
  for (MPI_Datatype& t : strided) MPI_CHECK(MPI_Type_free(&t));  // the struct keeps them
  return type;
}

void FetchClient::free_landings(InFlight& f) {
  for (Landing& l : f.landings)
    if (l.type != MPI_DATATYPE_NULL) MPI_CHECK(MPI_Type_free(&l.type));
}

// Takes every reply that has arrived, whatever fetch it answers (its header names the ticket).
// A reply's fetch is known only from its header, after the receive: it is received through the
// landing of the oldest fetch awaiting this holder when that fetch's typed reply has its size
// (holders answer in request order unless an update makes a later request ready first), and
// moved if the header names another fetch. Other replies are received as bytes.
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
    const int h = st.MPI_SOURCE;  // holders are world ranks 0..H-1
    InFlight* guess = nullptr;
    for (const Job& g : jobs)
      if (g->stage == InFlight::Stage::awaiting_replies && h < static_cast<int>(g->groups.size()) &&
          !g->groups[h].empty() && !g->replied[h]) {
        const Landing& l = g->landings[h];
        if (l.type != MPI_DATATYPE_NULL && l.bytes == static_cast<std::size_t>(bytes))
          guess = g.get();
        break;
      }
    InFlight* f = receive_reply(m, bytes, h, guess, jobs, st.MPI_SOURCE);
    f->replied[h] = 1;
    --f->awaited_replies;
  }
}

FetchClient::InFlight* FetchClient::receive_reply(MPI_Message& m, int bytes, int h,
                                                  InFlight* into, const std::vector<Job>& jobs,
                                                  int source) {
  from_holders_ += bytes;
  PDT_CHECK(static_cast<std::size_t>(bytes) >= sizeof(wire::ReplyHeader),
            "short fetch reply from rank " + std::to_string(source));
  Buffer r;
  const char* head = nullptr;
  if (into != nullptr) {
    MPI_CHECK(MPI_Mrecv(MPI_BOTTOM, 1, into->landings[h].type, &m, MPI_STATUS_IGNORE));
    head = into->replies[h].data.get();
  } else {
    r = take_buffer(static_cast<std::size_t>(bytes));
    MPI_CHECK(MPI_Mrecv(r.data.get(), bytes, MPI_BYTE, &m, MPI_STATUS_IGNORE));
    head = r.data.get();
  }
  wire::ReplyHeader rh;
  std::memcpy(&rh, head, sizeof(rh));
  InFlight* f = nullptr;
  for (const Job& g : jobs)
    if (g->ticket == rh.ticket) f = g.get();
  PDT_CHECK(f != nullptr && f->stage == InFlight::Stage::awaiting_replies &&
                h < static_cast<int>(f->groups.size()) && !f->groups[h].empty() && !f->replied[h],
            "holder rank " + std::to_string(source) + " answered unknown fetch " +
                std::to_string(rh.ticket));
  if (f == into) {
    f->landings[h].received_typed = true;
    return f;
  }
  if (into != nullptr) {  // landed at the wrong fetch: back to bytes (its own reply comes later)
    ++moved_;
    r = take_buffer(static_cast<std::size_t>(bytes));
    int pos = 0;
    MPI_CHECK(MPI_Pack(MPI_BOTTOM, 1, into->landings[h].type, r.data.get(), bytes, &pos,
                       layout_.world()));
  }
  Landing& l = f->landings[h];
  if (l.type != MPI_DATATYPE_NULL && l.bytes == static_cast<std::size_t>(bytes)) {
    int pos = 0;
    MPI_CHECK(MPI_Unpack(r.data.get(), bytes, &pos, MPI_BOTTOM, 1, l.type, layout_.world()));
    l.received_typed = true;
    spare_.push_back(std::move(r));
  } else {
    f->replies[h] = std::move(r);
    l.received_typed = false;
  }
  return f;
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
    const Landing& l = f.landings[h];
    // Payloads follow the headers, or (typed) are where the landing put them.
    char* data = reply + sizeof(rh) + group.size() * sizeof(wire::BlockHeader);
    if (version == flip_at_version_) {
      (l.received_typed ? l.at[0].data : data)[0] ^= 0x10;
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
      if (l.received_typed) {
        PDT_CHECK(bh.bytes == l.at[i].bytes(),
                  "block " + d.name + " arrived with " + std::to_string(bh.bytes) +
                      " bytes, expected " + std::to_string(l.at[i].bytes()));
        data = l.at[i].data;
      }
      const bool in_place = l.received_typed && l.in_place[i];
      PDT_CHECK((in_place ? check_in_place(f, b, l.at[i]) : crc32c(data, nb)) == bh.crc,
                "CRC mismatch in block " + d.name + " (version " + std::to_string(version) +
                    ") fetched from holder " + std::to_string(h));
      fetched_ += static_cast<std::int64_t>(nb);
      if (in_place) continue;
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
    }
  }
  free_landings(f);
  for (Buffer& r : f.replies)
    if (r.capacity > 0) spare_.push_back(std::move(r));
  if (stop) stop_ = true;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const UpdateInfo& u : learnt) known_[u.version] = u;
  return known_.count(version) ? known_.at(version) : UpdateInfo{version, 0.0, 0.0};
}

// Rows a cache-sized chunk at a time: CRC32C them, then let the target finish them while they
// are in cache.
std::uint32_t FetchClient::check_in_place(const InFlight& f, int block, const BlockPlace& p) const {
  constexpr std::int64_t kChunkBytes = 32 << 10;
  const std::int64_t step = std::max<std::int64_t>(1, kChunkBytes / std::max<std::int64_t>(1, p.row_bytes));
  const int w = wire_width();
  std::uint32_t crc = 0;
  for (std::int64_t r0 = 0; r0 < p.rows; r0 += step) {
    const std::int64_t r1 = std::min(p.rows, r0 + step);
    if (p.contiguous()) {
      crc = crc32c_extend(crc, p.data + r0 * p.row_bytes,
                          static_cast<std::size_t>((r1 - r0) * p.row_bytes));
    } else {
      for (std::int64_t r = r0; r < r1; ++r)
        crc = crc32c_extend(crc, p.data + r * p.stride_bytes, static_cast<std::size_t>(p.row_bytes));
    }
    if (f.target.landed) f.target.landed(block, w, r0, r1);
  }
  return crc;
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
  std::vector<ConstBlockPlace> places;  // packed back to back in the order of `blocks`
  for (int b : blocks) {
    const std::int64_t bytes = table_.blocks[b].numel * static_cast<std::int64_t>(sizeof(float));
    places.push_back(ConstBlockPlace{reinterpret_cast<const char*>(grads), 1, bytes, bytes});
    grads += table_.blocks[b].numel;
  }
  return send_push(step, blocks, places);
}

namespace {

// The CRC32C of a block's rows, in order (the block as packed).
std::uint32_t place_crc(const ConstBlockPlace& t) {
  const auto row = static_cast<std::size_t>(t.row_bytes);
  std::uint32_t crc = crc32c(t.data, row);
  for (std::int64_t r = 1; r < t.rows; ++r) crc = crc32c_extend(crc, t.data + r * t.stride_bytes, row);
  return crc;
}

}  // namespace

// Per holder: a header message, then the payloads back to back in one contiguous message, so
// the holder copies it in itself (MPI moves a contiguous message between ranks of a node in one
// copy by the receiver, and over RDMA without the sender's CPU) while this rank computes. Raw
// gradients that lie back to back are sent from where they are; others are packed or encoded.
ParameterService::PushTicket FetchClient::send_push(std::int64_t step,
                                                    const std::vector<int>& blocks,
                                                    const std::vector<ConstBlockPlace>& places) {
  PDT_CHECK(places.size() == blocks.size(), "a push needs one place per block");
  std::vector<const ConstBlockPlace*> place_of(table_.blocks.size(), nullptr);
  for (std::size_t i = 0; i < blocks.size(); ++i) place_of[blocks[i]] = &places[i];
  const auto groups = by_holder(blocks);
  const PushTicket ticket = next_push_ticket_++;
  Pushing& out = pushes_[ticket];
  out.ticket = ticket;
  std::vector<float> packed;  // one block, for encoding
  for (int h = 0; h < static_cast<int>(groups.size()); ++h) {
    if (groups[h].empty()) continue;
    std::vector<char>& head = out.headers.emplace_back();
    std::vector<char>& payload = out.payloads.emplace_back();
    head.resize(sizeof(wire::PushHeader) + groups[h].size() * sizeof(wire::BlockHeader));
    const wire::PushHeader ph{step, static_cast<std::int64_t>(groups[h].size())};
    std::memcpy(head.data(), &ph, sizeof(ph));
    // Raw and back to back in memory: the payload is the gradients themselves.
    const char* direct = push_codec_ == WireCodec::raw ? place_of[groups[h].front()]->data : nullptr;
    for (int b : groups[h]) {
      const ConstBlockPlace& t = *place_of[b];
      if (!t.contiguous() || t.data != direct) direct = nullptr;
      if (direct != nullptr) direct += t.bytes();
    }
    const char* from = direct != nullptr ? place_of[groups[h].front()]->data : nullptr;
    std::int64_t total = 0;
    for (std::size_t i = 0; i < groups[h].size(); ++i) {
      const int b = groups[h][i];
      const ConstBlockPlace& t = *place_of[b];
      PDT_CHECK(t.bytes() == table_.blocks[b].numel * static_cast<std::int64_t>(sizeof(float)),
                "the gradient of block " + table_.blocks[b].name + " has the wrong size");
      wire::BlockHeader bh{b, 0, step, 0};
      if (push_codec_ == WireCodec::raw) {
        bh.bytes = t.bytes();
        bh.crc = place_crc(t);
        if (from == nullptr) {
          payload.resize(payload.size() + static_cast<std::size_t>(t.bytes()));
          pack_rows(t, payload.data() + payload.size() - static_cast<std::size_t>(t.bytes()));
        }
      } else {
        packed.resize(static_cast<std::size_t>(table_.blocks[b].numel));
        pack_rows(t, reinterpret_cast<char*>(packed.data()));
        const std::size_t at = payload.size();
        bh.bytes = static_cast<std::int64_t>(
            wire_encode(push_codec_, packed.data(), table_.blocks[b].numel, payload));
        bh.crc = crc32c(payload.data() + at, static_cast<std::size_t>(bh.bytes));
      }
      std::memcpy(head.data() + sizeof(ph) + i * sizeof(bh), &bh, sizeof(bh));
      total += bh.bytes;
      pushed_ += bh.bytes;
    }
    if (from == nullptr) from = payload.data();
    const int holder = layout_.holder_world_rank(h);
    MPI_CHECK(MPI_Isend(head.data(), static_cast<int>(head.size()), MPI_BYTE, holder, wire::kPush,
                        layout_.world(), &out.requests.emplace_back()));
    PDT_CHECK(total <= std::numeric_limits<int>::max(),
              "a push of " + std::to_string(total) + " bytes to one holder exceeds an MPI count");
    MPI_CHECK(MPI_Isend(from, static_cast<int>(total), MPI_BYTE, holder, wire::kPushPayload,
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

void FetchClient::free_push(std::map<PushTicket, Pushing>::iterator it) { pushes_.erase(it); }

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
  // `done` carries the step the run diverged at (0: none), so holders skip the final checkpoint.
  for (int h = 0; h < layout_.shape().holders; ++h)
    MPI_CHECK(MPI_Send(&diverged_step_, 1, MPI_INT64_T, layout_.holder_world_rank(h), wire::kDone,
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
