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
                         WireCodec fetch_codec, WireCodec push_codec, bool fetch_thread,
                         const SharedSegments* segments)
    : layout_(layout), table_(table), owner_(std::move(owner)), fetch_codec_(fetch_codec),
      relay_(layout), pushes_(layout, table, owner_, push_codec), segments_(segments) {
  flip_at_version_ = test_hooks::flip_fetch_bit_at_version().value_or(-1);
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
  // The test hook damages a block as it arrives from a holder (relays pass the damage on).
  f->flip_pending = version == flip_at_version_ && layout_.dp_rank() == 0;
  if (f->flip_pending) flip_at_version_ = -1;
  f->groups = group_by_owner(blocks, owner_, layout_.shape().holders);
  f->replies.resize(f->groups.size());
  f->arrivals.resize(f->groups.size());
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
    std::vector<char>& m = f.requests[h];
    m = wire::request_message(
        {f.version, static_cast<std::int64_t>(f.groups[h].size()), f.ticket}, f.groups[h]);
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

// Takes every reply header that has arrived, whatever fetch it answers (it names the ticket),
// and posts its payloads' receives; then checks the payloads that have arrived, every fetch's.
bool FetchClient::receive_replies(const std::vector<Job>& jobs) {
  bool got = false;
  for (;;) {
    int flag = 0;
    MPI_Message m;
    MPI_Status st;
    MPI_CHECK(MPI_Improbe(MPI_ANY_SOURCE, wire::kFetchReply, layout_.world(), &flag, &m, &st));
    if (!flag) break;
    got = true;
    int bytes = 0;
    MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &bytes));
    receive_header(m, bytes, st.MPI_SOURCE, jobs);  // holders are world ranks 0..H-1
  }
  for (const Job& j : jobs)
    if (j->stage == InFlight::Stage::awaiting_replies) got = check_arrived(*j) || got;
  return got;
}

void FetchClient::receive_header(MPI_Message& m, int bytes, int h, const std::vector<Job>& jobs) {
  const std::string from = "holder rank " + std::to_string(h);
  header_.resize(static_cast<std::size_t>(bytes));
  MPI_CHECK(MPI_Mrecv(header_.data(), bytes, MPI_BYTE, &m, MPI_STATUS_IGNORE));
  from_holders_ += bytes;
  const wire::ReplyView reply(header_, wire::ReplyView::Payloads::apart, from);
  const wire::ReplyHeader& rh = reply.head();
  InFlight* f = nullptr;
  bool earlier_waits = false;  // an older fetch still awaits this holder's reply
  for (const Job& g : jobs) {
    const bool awaits = g->stage == InFlight::Stage::awaiting_replies &&
                        h < static_cast<int>(g->groups.size()) && !g->groups[h].empty() &&
                        !g->replied[h];
    if (g->ticket == rh.ticket) {
      f = awaits ? g.get() : nullptr;
      break;
    }
    earlier_waits = earlier_waits || awaits;
  }
  PDT_CHECK(f != nullptr, from + " answered unknown fetch " + std::to_string(rh.ticket));
  PDT_CHECK(rh.n == static_cast<std::int64_t>(f->groups[h].size()),
            "malformed fetch reply header from " + from);
  if (earlier_waits) ++out_of_order_;
  post_payloads(*f, h, reply);
  f->replied[h] = 1;
  --f->awaited_replies;
}

// The header says each payload's size; a placed block must have exactly its tile's. Payloads
// that are not placed go back to back after the headers in the reply buffer, as a relay sends
// them on.
void FetchClient::post_payloads(InFlight& f, int h, const wire::ReplyView& reply) {
  const std::vector<int>& group = f.groups[h];
  const std::size_t n = group.size();
  const int w = f.target && !relay_.active() ? wire_width() : 0;
  Arrival& a = f.arrivals[h];
  a.expect(reply);
  std::size_t side = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const wire::BlockHeader& bh = a.sent[i];
    const BlockDesc& d = table_.blocks[group[i]];
    const BlockPlace p = w > 0 && bh.bytes > 0 ? f.target.place(group[i], w) : BlockPlace{};
    if (p.data != nullptr) {
      PDT_CHECK(p.bytes() == bh.bytes, "block " + d.name + " arrived with " +
                                           std::to_string(bh.bytes) + " bytes, expected " +
                                           std::to_string(p.bytes()));
      a.at[i] = p;
      a.in_place[i] = 1;
    } else {
      a.at[i] = BlockPlace{nullptr, 1, bh.bytes, bh.bytes};
      side += static_cast<std::size_t>(bh.bytes);
    }
  }
  ByteBuffer& r = f.replies[h];
  r = take_buffer(reply.header_bytes() + side);
  std::memcpy(r.data.get(), header_.data(), reply.header_bytes());
  char* next = r.data.get() + reply.header_bytes();
  for (std::size_t i = 0; i < n; ++i)
    if (!a.in_place[i]) a.at[i].data = next, next += a.at[i].bytes();
  if (reply.head().shared) {
    copy_shared_payloads(f, h);
    return;
  }
  const int source = layout_.holder_world_rank(h);
  for (std::size_t i = 0; i < n; ++i) {
    if (a.at[i].bytes() == 0) continue;  // the holder sends nothing for it either
    from_holders_ += a.at[i].bytes();
    MPI_Request r = receive_payload(f, a.at[i], source);
    // A payload whose send has arrived is copied inside MPI_Irecv; checking it now, before the
    // next one is copied, reads it from cache.
    int done = 0;
    MPI_CHECK(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
    if (done) {
      verify_block(f, h, i);
      continue;
    }
    f.payloads.push_back(r);
    f.payload_of.emplace_back(h, static_cast<int>(i));
    ++f.awaited_payloads;
  }
}

void FetchClient::copy_shared_payloads(InFlight& f, int h) {
  const int holder = layout_.holder_world_rank(h);
  const char* segment = segments_ ? segments_->of(holder) : nullptr;
  PDT_CHECK(segment != nullptr, "holder " + std::to_string(h) +
                                    " answered through a shared segment this rank cannot see");
  const auto size = static_cast<std::int64_t>(segments_->size_of(holder));
  segments_->sync();  // the holder's writes, before this reply named them
  Arrival& a = f.arrivals[h];
  for (std::size_t i = 0; i < f.groups[h].size(); ++i) {
    const wire::BlockHeader& bh = a.sent[i];
    const BlockPlace& p = a.at[i];
    PDT_CHECK(bh.at >= 0 && bh.at + p.bytes() <= size,
              "block " + table_.blocks[f.groups[h][i]].name + " of holder " + std::to_string(h) +
                  " lies outside its shared segment (" + std::to_string(bh.at) + " + " +
                  std::to_string(p.bytes()) + " bytes of " + std::to_string(size) + ")");
    from_holders_ += p.bytes();
    from_shared_ += p.bytes();
    verify_block(f, h, i, segment + bh.at);
  }
}

MPI_Request FetchClient::receive_payload(InFlight& f, const BlockPlace& p, int source) {
  MPI_Request r = MPI_REQUEST_NULL;
  if (p.contiguous()) {
    MPI_CHECK(MPI_Irecv(p.data, static_cast<int>(p.bytes()), MPI_BYTE, source,
                        wire::kFetchPayload, layout_.world(), &r));
    return r;
  }
  // A column slab of a row-parallel weight: its rows are apart in the unit.
  MPI_Datatype& t = f.strided.emplace_back();
  MPI_CHECK(MPI_Type_create_hvector(static_cast<int>(p.rows), static_cast<int>(p.row_bytes),
                                    p.stride_bytes, MPI_BYTE, &t));
  MPI_CHECK(MPI_Type_commit(&t));
  MPI_CHECK(MPI_Irecv(p.data, 1, t, source, wire::kFetchPayload, layout_.world(), &r));
  return r;
}

bool FetchClient::check_arrived(InFlight& f) {
  if (f.awaited_payloads == 0) return false;
  completed_.resize(f.payloads.size());
  int done = 0;
  MPI_CHECK(MPI_Testsome(static_cast<int>(f.payloads.size()), f.payloads.data(), &done,
                         completed_.data(), MPI_STATUSES_IGNORE));
  if (done == MPI_UNDEFINED || done == 0) return false;
  for (int k = 0; k < done; ++k) {
    const auto [h, i] = f.payload_of[static_cast<std::size_t>(completed_[k])];
    verify_block(f, h, static_cast<std::size_t>(i));
    --f.awaited_payloads;
  }
  return true;
}

// Where every fetched block is checked, however it landed: received into its tile or the
// reply buffer, copied from a holder's shared segment (`from`: the CRC32C is taken in the same
// pass as the copy), or relayed by the data-parallel parent. Its id and version must be the
// fetch's and its CRC32C, taken while it is in cache (fused with the target's finishing pass
// when it landed in place), the one its holder sent; a mismatch ends the job naming the block.
// The test hook damages the first block checked here.
void FetchClient::verify_block(InFlight& f, int h, std::size_t i, const char* from) {
  Arrival& a = f.arrivals[h];
  const BlockPlace& p = a.at[i];
  const wire::BlockHeader& sent = a.sent[i];
  const int b = f.groups[h][i];
  const BlockDesc& d = table_.blocks[b];
  PDT_CHECK(sent.id == b && sent.version == f.version,
            "block " + d.name + " arrived as id " + std::to_string(sent.id) + " version " +
                std::to_string(sent.version) + ", expected version " + std::to_string(f.version));
  if (f.flip_pending && p.bytes() > 0) {
    if (from) unpack_rows(from, p), from = nullptr;
    p.data[0] ^= 0x10;
    f.flip_pending = false;
  }
  const auto bytes = static_cast<std::size_t>(p.bytes());
  const std::uint32_t crc = a.in_place[i] ? check_in_place(f, b, p, from)
                            : from        ? crc32c_copy(0u, p.data, from, bytes)
                                          : crc32c(p.data, bytes);
  PDT_CHECK(crc == sent.crc, "CRC mismatch in block " + d.name + " (version " +
                                 std::to_string(f.version) + ") fetched from holder " +
                                 std::to_string(h));
  a.checked[i] = 1;
}

void FetchClient::Arrival::expect(const wire::ReplyView& reply) {
  const auto n = static_cast<std::size_t>(reply.n());
  header = reply.head();
  sent.resize(n);
  for (std::size_t i = 0; i < n; ++i) sent[i] = reply.entry(static_cast<std::int64_t>(i));
  at.assign(n, BlockPlace{});
  in_place.assign(n, 0);
  checked.assign(n, 0);
}

// A relayed reply: its payloads lie back to back after its headers.
void FetchClient::place_buffered(InFlight& f, int h) {
  const ByteBuffer& r = f.replies[h];
  const wire::ReplyView reply({r.data.get(), r.size}, wire::ReplyView::Payloads::following,
                              "the data-parallel parent");
  PDT_CHECK(reply.n() == static_cast<std::int64_t>(f.groups[h].size()),
            "malformed relayed fetch reply");
  Arrival& a = f.arrivals[h];
  a.expect(reply);
  std::size_t at = reply.header_bytes();
  for (std::size_t i = 0; i < a.sent.size(); ++i) {
    const std::int64_t bytes = a.sent[i].bytes;
    a.at[i] = BlockPlace{r.data.get() + at, 1, bytes, bytes};
    at += static_cast<std::size_t>(bytes);
  }
}

void FetchClient::free_receive_types(InFlight& f) {
  for (MPI_Datatype& t : f.strided) MPI_CHECK(MPI_Type_free(&t));
  f.strided.clear();
}

bool FetchClient::advance(InFlight& f) {
  using S = InFlight::Stage;
  const S before = f.stage;
  bool received = false;
  if (f.stage == S::awaiting_replies) {
    if (f.awaited_replies > 0 || f.awaited_payloads > 0) return false;
    int sent = 0;
    MPI_CHECK(MPI_Testall(static_cast<int>(f.sends.size()), f.sends.data(), &sent,
                          MPI_STATUSES_IGNORE));
    if (!sent) return false;
    f.stage = relay_.active() ? S::relay_send : S::ready;
  }
  if (f.stage == S::relay_recv) {  // from the parent, one message per holder in holder order
    while (f.next_group < f.groups.size()) {
      if (f.groups[f.next_group].empty()) {
        ++f.next_group;
        continue;
      }
      ByteBuffer& r = f.replies[f.next_group];
      if (!relay_.receive([&](std::size_t bytes) -> ByteBuffer& {
            return r = take_buffer(bytes);
          }))
        return received;
      place_buffered(f, static_cast<int>(f.next_group));
      ++f.next_group;
      received = true;
    }
    f.stage = S::relay_send;
  }
  if (f.stage == S::relay_send) {
    if (!f.relay_posted) {
      for (std::size_t h = 0; h < f.groups.size(); ++h)
        if (!f.groups[h].empty()) relay_.forward(f.replies[h], f.relay_reqs);
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
    Arrival& a = f.arrivals[h];
    const wire::ReplyHeader& rh = a.header;
    PDT_CHECK(rh.version == version && rh.ticket == f.ticket,
              "holder " + std::to_string(h) + " answered with version " +
                  std::to_string(rh.version) + " for a fetch of version " +
                  std::to_string(version));
    stop = stop || rh.stop != 0;
    for (std::int64_t i = 0; i < rh.n_recent && i < wire::kMaxRecentUpdates; ++i)
      learnt.push_back(UpdateInfo{rh.recent[i].version, rh.recent[i].grad_norm, rh.recent[i].lr});
    for (std::size_t i = 0; i < group.size(); ++i) {
      const int b = group[i];
      const BlockDesc& d = table_.blocks[b];
      if (!a.checked[i]) verify_block(f, h, i);  // relayed: checked here, from the buffer
      const auto nb = static_cast<std::size_t>(a.sent[i].bytes);
      fetched_ += static_cast<std::int64_t>(nb);
      if (a.in_place[i]) continue;
      const char* data = a.at[i].data;
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
    }
  }
  free_receive_types(f);
  for (ByteBuffer& r : f.replies)
    if (r.capacity > 0) spare_.give(r.capacity, std::move(r));
  if (stop) stop_ = true;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const UpdateInfo& u : learnt) known_[u.version] = u;
  return known_.count(version) ? known_.at(version) : UpdateInfo{version, 0.0, 0.0};
}

// Rows a cache-sized chunk at a time: CRC32C them, then let the target finish them while they
// are in cache.
std::uint32_t FetchClient::check_in_place(const InFlight& f, int block, const BlockPlace& p,
                                          const char* from) const {
  constexpr std::int64_t kChunkBytes = 32 << 10;
  const std::int64_t step = std::max<std::int64_t>(1, kChunkBytes / std::max<std::int64_t>(1, p.row_bytes));
  const int w = wire_width();
  std::uint32_t crc = 0;
  for (std::int64_t r0 = 0; r0 < p.rows; r0 += step) {
    const std::int64_t r1 = std::min(p.rows, r0 + step);
    if (p.contiguous()) {
      char* at = p.data + r0 * p.row_bytes;
      const auto bytes = static_cast<std::size_t>((r1 - r0) * p.row_bytes);
      crc = from ? crc32c_copy(crc, at, from + r0 * p.row_bytes, bytes)
                 : crc32c_extend(crc, at, bytes);
    } else {
      const auto bytes = static_cast<std::size_t>(p.row_bytes);
      for (std::int64_t r = r0; r < r1; ++r)
        crc = from ? crc32c_copy(crc, p.data + r * p.stride_bytes, from + r * p.row_bytes, bytes)
                   : crc32c_extend(crc, p.data + r * p.stride_bytes, bytes);
    }
    if (f.target.landed) f.target.landed(block, w, r0, r1);
  }
  return crc;
}

// The smallest spare buffer that fits, or a new one.
ByteBuffer FetchClient::take_buffer(std::size_t bytes) {
  ByteBuffer b = spare_.take_fitting(bytes).value_or(ByteBuffer{});
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
  return pushes_.start(step, blocks, places, false);
}

ParameterService::PushTicket FetchClient::start_push_from(
    std::int64_t step, const std::vector<int>& blocks, const std::vector<ConstBlockPlace>& places) {
  return pushes_.start(step, blocks, places, true);
}

bool FetchClient::push_done(PushTicket ticket) { return pushes_.done(ticket); }

void FetchClient::wait_push(PushTicket ticket) { pushes_.wait(ticket); }

std::uint32_t FetchClient::finish_and_checksum() {
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
