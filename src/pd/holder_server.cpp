#include "pdtrain/pd/holder_server.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <span>
#include <thread>

#include "pdtrain/core/counts.hpp"
#include "pdtrain/core/crc32c.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/quiet_wait.hpp"
#include "pdtrain/optim/divergence.hpp"
#include "pdtrain/pd/wire.hpp"

namespace pdtrain {

HolderServer::HolderServer(const Layout& layout, const BlockTable& table, std::vector<int> owner,
                           std::vector<int> contributions, const AdamWConfig& opt,
                           WireCodec fetch_codec, WireCodec push_codec,
                           const StalenessPlan& staleness, TraceRecorder* trace)
    : layout_(layout), table_(table), owner_(std::move(owner)),
      contributions_(std::move(contributions)), opt_(opt), fetch_codec_(fetch_codec),
      push_codec_(push_codec), plan_(staleness), staleness_(staleness.staleness), trace_(trace) {
  PDT_CHECK(staleness_ >= 0 && staleness_ < wire::kMaxRecentUpdates, "staleness out of range");
  recent_[0] = UpdateInfo{0, 0.0, 0.0};
  const int me = layout.holder_index();
  std::vector<std::pair<int, float*>> initial;
  for (std::size_t b = 0; b < owner_.size(); ++b) {
    if (owner_[b] != me) continue;
    Owned& o = owned_[static_cast<int>(b)];
    const auto n = static_cast<std::size_t>(table.blocks[b].numel);
    o.state.param.resize(n);
    o.state.m.assign(n, 0.0f);
    o.state.v.assign(n, 0.0f);
    o.state.decay = table.blocks[b].decay;
    initial.emplace_back(static_cast<int>(b), o.state.param.data());
    pushes_per_step_ += contributions_[b];
  }
  fill_initial_values(table, initial);
  for (auto& [id, o] : owned_) encode(o);
  for (auto& [id, o] : owned_) update_order_.emplace_back(id, &o);
  std::stable_sort(update_order_.begin(), update_order_.end(), [&](const auto& a, const auto& b) {
    return table.blocks[a.first].need_rank < table.blocks[b.first].need_rank;
  });
}

// Raw blocks at staleness 0 are sent straight from the parameters: only one version is ever
// served, replies are drained before an update starts, and during it a block is unavailable
// until it is published, so the parameters never change under a reply. Saves a copy per step.
// (Published through shared memory the parameters change while compute ranks copy from
// the slots, so there is always a copy.)
bool HolderServer::serves_in_place() const {
  return fetch_codec_ == WireCodec::raw && staleness_ == 0 && segments_ == nullptr;
}

namespace {
// A slot's bytes, rounded to cache lines so that no two slots share one.
std::int64_t slot_bytes_of(const BlockDesc& d, WireCodec codec) {
  return (d.numel * fused_wire_bytes(codec) + 63) / 64 * 64;
}
}  // namespace

std::size_t HolderServer::shared_bytes(const BlockTable& table, const std::vector<int>& owner,
                                       int holder, WireCodec fetch_codec, int staleness) {
  if (fused_wire_bytes(fetch_codec) == 0) return 0;
  std::int64_t bytes = 0;
  for (std::size_t b = 0; b < owner.size(); ++b)
    if (owner[b] == holder) bytes += slot_bytes_of(table.blocks[b], fetch_codec) * (staleness + 1);
  return static_cast<std::size_t>(bytes);
}

void HolderServer::publish_through(const SharedSegments* segments) {
  const std::size_t need = shared_bytes(table_, owner_, layout_.holder_index(), fetch_codec_,
                                        staleness_);
  PDT_CHECK(segments && need > 0 && segments->my_bytes() == need,
            "holder " + std::to_string(layout_.holder_index()) + " was given a shared segment of " +
                std::to_string(segments ? segments->my_bytes() : 0) + " bytes for " +
                std::to_string(need));
  segments_ = segments;
  std::int64_t at = 0;
  for (auto& [id, o] : owned_) {  // by id, as shared_bytes counts
    o.slot_bytes = slot_bytes_of(table_.blocks[id], fetch_codec_);
    o.slots_at = at;
    at += o.slot_bytes * (staleness_ + 1);
    o.versions.clear();
    encode(o);
  }
}

std::unique_ptr<SharedSegments> share_holder_segments(const Layout& layout,
                                                      const BlockTable& table,
                                                      const std::vector<int>& owner,
                                                      WireCodec fetch_codec, int staleness,
                                                      int node, std::string* why_not) {
  if (fused_wire_bytes(fetch_codec) == 0) {
    if (why_not) *why_not = std::string("the fetch codec ") + to_string(fetch_codec) +
                            " has no fixed width";
    return nullptr;
  }
  const std::size_t mine =
      layout.is_holder()
          ? HolderServer::shared_bytes(table, owner, layout.holder_index(), fetch_codec, staleness)
          : 0;
  return SharedSegments::create(layout.world(), mine, why_not, node);
}

char* HolderServer::slot(const Owned& o, std::int64_t version) const {
  return segments_->mine() + o.slots_at + (version % (staleness_ + 1)) * o.slot_bytes;
}

// A block is encoded once per version, however many ranks fetch it; the last staleness+1
// versions stay available. (Initial and restored state; updates encode in update_blocks.)
void HolderServer::encode(Owned& o) {
  Encoded e;
  const auto n = static_cast<std::int64_t>(o.state.param.size());
  if (serves_in_place()) {
    publish(o, version_, std::move(e), crc32c(o.state.param.data(), static_cast<std::size_t>(n) * 4));
    return;
  }
  wire_encode(fetch_codec_, o.state.param.data(), n, e.storage);
  const std::uint32_t crc = crc32c(e.storage.data(), e.storage.size());
  if (segments_) {  // into its slot (rare: the initial, restored and not applied versions)
    std::memcpy(slot(o, version_), e.storage.data(), e.storage.size());
    e.storage = {};
  }
  publish(o, version_, std::move(e), crc);
}

// Makes `fresh` the block's bytes of `step` and forgets versions older than the window.
void HolderServer::publish(Owned& o, std::int64_t step, Encoded fresh, std::uint32_t crc) {
  Encoded& e = o.versions[step] = std::move(fresh);
  if (segments_) {
    e.data = slot(o, step);
    e.size = static_cast<std::size_t>(o.state.param.size()) * fused_wire_bytes(fetch_codec_);
    e.shared_at = e.data - segments_->mine();
  } else if (serves_in_place()) {
    e.data = reinterpret_cast<const char*>(o.state.param.data());
    e.size = o.state.param.size() * sizeof(float);
  } else {
    e.data = e.storage.data();
    e.size = e.storage.size();
  }
  e.crc = crc;
  o.versions.erase(o.versions.begin(), o.versions.lower_bound(step - staleness_));
}

void HolderServer::restore(std::int64_t version, std::map<int, BlockState> blocks) {
  version_ = version;
  start_version_ = version;
  recent_.clear();
  recent_[version] = UpdateInfo{version, 0.0, 0.0};
  for (auto& [id, o] : owned_) {
    auto it = blocks.find(id);
    PDT_CHECK(it != blocks.end(), "restored state lacks block " + table_.blocks[id].name);
    PDT_CHECK(it->second.param.size() == o.state.param.size(),
              "restored block " + table_.blocks[id].name + " has the wrong size");
    const bool decay = o.state.decay;
    o.state = std::move(it->second);
    o.state.decay = decay;
    o.versions.clear();
    encode(o);
  }
}

HolderHooks::OwnedBlocks HolderServer::owned_blocks() const {
  HolderHooks::OwnedBlocks out;
  for (const auto& [id, o] : owned_) out[id] = &o.state;
  return out;
}

void HolderServer::run() {
  const int n_compute = layout_.shape().compute();
  const int threads = resolve_holder_threads(threads_configured_, ranks_on_node_);
  pool_ = std::make_unique<WorkerPool>(threads);
  Backoff backoff;
  while (done_ranks_ < n_compute) {
    retire_sent_replies();
    if (poll_once()) {
      backoff.reset();
    } else if (!sending_.empty()) {
      // A reply's sends complete only while this rank is inside MPI (small payloads are copied
      // through shared memory by the sender; a large one ends with the receiver's FIN): sleeping
      // now would pace the fetching rank (perf/RESULTS.md, "After the holder stops sleeping").
      // Yield instead, so ranks sharing a core run.
      std::this_thread::yield();
    } else {
      backoff.pause();
    }
  }
  drain_sent_replies();
  if (diverged_at_ > 0 || compute_diverged_) {
    if (hooks_.after_divergence) hooks_.after_divergence();
  } else if (hooks_.at_end) {
    hooks_.at_end(version_, [this] { return owned_blocks(); });
  }
  if (verbose_) print_traffic();
  send_final_crc();
}

bool HolderServer::poll_once() {
  int flag = 0;
  MPI_Status st;
  MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, layout_.world(), &flag, &st));
  if (!flag) return false;
  int bytes = 0;
  MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &bytes));
  // Grows, never shrinks: a push is hundreds of MiB and must not be zero-filled every step.
  const auto size = static_cast<std::size_t>(bytes);
  if (inbox_.size() < size) inbox_.resize(size);
  MPI_CHECK(MPI_Recv(inbox_.data(), bytes, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, layout_.world(),
                     MPI_STATUS_IGNORE));
  received_ += bytes;
  handle(st.MPI_SOURCE, st.MPI_TAG, std::span<const char>(inbox_.data(), size));
  return true;
}

void HolderServer::handle(int source, int tag, std::span<const char> msg) {
  switch (tag) {
    case wire::kFetchRequest: {
      const wire::RequestView request(msg, "rank " + std::to_string(source));
      const wire::FetchRequest& req = request.head();
      for (std::int64_t i = 0; i < request.n(); ++i)
        PDT_CHECK(owned_.count(request.entry(i)),
                  "rank " + std::to_string(source) + " asked holder " +
                      std::to_string(layout_.holder_index()) + " for block " +
                      std::to_string(request.entry(i)) + ", which it does not own");
      if (!ready(request)) {
        deferred_.push_back({source, std::vector<char>(msg.begin(), msg.end())});
      } else {
        PDT_CHECK(req.version >= version_ - staleness_,
                  "rank " + std::to_string(source) + " asked for parameter version " +
                      std::to_string(req.version) + " but holder " +
                      std::to_string(layout_.holder_index()) + " is at version " +
                      std::to_string(version_) + " and keeps " +
                      std::to_string(staleness_ + 1) + " version(s)");
        serve_fetch(source, request);
      }
      break;
    }
    case wire::kPush: {
      const wire::PushView push(msg, "rank " + std::to_string(source));
      take_push(source, push, receive_push_payload(source, push));
      break;
    }
    case wire::kDone: {
      std::int64_t diverged_step = 0;  // a compute rank's loss diverged at this step
      PDT_CHECK(msg.size() >= sizeof(diverged_step),
                "malformed done message from rank " + std::to_string(source));
      std::memcpy(&diverged_step, msg.data(), sizeof(diverged_step));
      compute_diverged_ = compute_diverged_ || diverged_step > 0;
      ++done_ranks_;
      break;
    }
    default:
      PDT_CHECK(false, "holder received unexpected message tag " + std::to_string(tag) +
                           " from rank " + std::to_string(source));
  }
}

void HolderServer::serve_fetch(int source, const wire::RequestView& request) {
  ScopedPhase t(timers_, "serve");
  TraceSpan span(trace_, "serve fetch", "pd");
  const wire::FetchRequest& req = request.head();
  const std::int64_t v = req.version;
  // The reply is a header message, then each block's encoded bytes where they already are, one
  // contiguous message per block: MPI moves a contiguous message within a node by one copy that
  // the receiver makes alone (Open MPI's CMA), straight into its tile, and over RDMA across
  // nodes; a datatype would cut it into fragments that both ranks must drive.
  Sending& s = sending_.emplace_back();
  wire::ReplyHeader rh{};
  rh.version = v;
  rh.n = req.n;
  rh.ticket = req.ticket;
  rh.stop = hooks_.stop_requested && hooks_.stop_requested() ? 1 : 0;
  for (const auto& [version, info] : recent_)
    rh.recent[rh.n_recent++] = wire::WireUpdateInfo{version, info.grad_norm, info.lr};
  // A compute rank on this node copies the payloads from this holder's segment itself.
  const bool shared = segments_ && segments_->on_node(source);
  rh.shared = shared ? 1 : 0;
  std::vector<wire::BlockHeader> blocks;
  std::vector<const Encoded*> payloads;
  for (std::int64_t i = 0; i < req.n; ++i) {
    const Encoded& e = owned_.at(request.entry(i)).versions.at(v);
    blocks.push_back({request.entry(i), e.crc, v, static_cast<std::int64_t>(e.size),
                      shared ? e.shared_at : -1});
    if (shared) {
      sent_ += static_cast<std::int64_t>(e.size);
      sent_shared_ += static_cast<std::int64_t>(e.size);
    }
    // The receiver posts nothing for an empty block, or for one it copies itself.
    if (e.size > 0 && !shared) payloads.push_back(&e);
  }
  s.bytes = wire::message_with_blocks(rh, blocks);
  if (shared) segments_->sync();  // the slots' bytes before the reply that names them
  // Not waited for here: a compute rank that prefetched may be busy in a GEMM and take the
  // reply later, and meanwhile this holder serves others. The encoded blocks stay untouched
  // until the reply has gone (finish_step drains replies before re-encoding).
  s.requests.resize(1 + payloads.size());
  MPI_CHECK(MPI_Isend(s.bytes.data(), static_cast<int>(s.bytes.size()), MPI_BYTE, source,
                      wire::kFetchReply, layout_.world(), &s.requests[0]));
  sent_ += static_cast<std::int64_t>(s.bytes.size());
  for (std::size_t i = 0; i < payloads.size(); ++i) {
    MPI_CHECK(MPI_Isend(payloads[i]->data, static_cast<int>(payloads[i]->size), MPI_BYTE, source,
                        wire::kFetchPayload, layout_.world(), &s.requests[1 + i]));
    sent_ += static_cast<std::int64_t>(payloads[i]->size);
  }
}

void HolderServer::retire_sent_replies() {
  while (!sending_.empty()) {
    Sending& s = sending_.front();
    int done = 0;
    MPI_CHECK(MPI_Testall(static_cast<int>(s.requests.size()), s.requests.data(), &done,
                          MPI_STATUSES_IGNORE));
    if (!done) return;
    sending_.pop_front();
  }
}

void HolderServer::drain_sent_replies() {
  for (Sending& s : sending_) wait_all_quietly(static_cast<int>(s.requests.size()), s.requests.data());
  sending_.clear();
}

// A push's payloads follow its header as one contiguous message from the same rank (MPI keeps
// their order); this holder copies it in at once, without the pushing rank's help.
std::span<const char> HolderServer::receive_push_payload(int source, const wire::PushView& push) {
  const std::int64_t bytes = push.payload_bytes();
  if (payload_.size() < static_cast<std::size_t>(bytes)) payload_.resize(static_cast<std::size_t>(bytes));
  MPI_Request r;
  MPI_CHECK(MPI_Irecv(payload_.data(), static_cast<int>(bytes), MPI_BYTE, source,
                      wire::kPushPayload, layout_.world(), &r));
  MPI_Status st;
  // Yielding, not sleeping: a payload sent as a datatype over a compute rank's tiles
  // (pd.pushes_in_flight = 0) advances only while both ranks poll.
  wait_yielding(&r, &st);
  int got = 0;
  MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &got));
  PDT_CHECK(got == bytes, "rank " + std::to_string(source) + " pushed " + std::to_string(got) +
                              " payload bytes for " + std::to_string(bytes) + " in its header");
  received_ += bytes;
  return {payload_.data(), static_cast<std::size_t>(bytes)};
}

void HolderServer::take_push(int source, const wire::PushView& push,
                             std::span<const char> payload) {
  const wire::PushHeader& ph = push.head();
  PDT_CHECK(ph.step > version_ && ph.step <= version_ + 1 + staleness_,
            "holder " + std::to_string(layout_.holder_index()) + " got gradients of step " +
                std::to_string(ph.step) + " from rank " + std::to_string(source) +
                " at version " + std::to_string(version_) + " (staleness " +
                std::to_string(staleness_) + ")");
  const char* data = payload.data();
  // A step's gradients may come in several messages (one per group of blocks); blocks count.
  auto missing = missing_.try_emplace(ph.step, pushes_per_step_).first;
  for (std::int64_t i = 0; i < ph.n; ++i) {
    const wire::BlockHeader bh = push.entry(i);
    take_contribution(bh.id, source, ph.step, data, bh.bytes, bh.crc);
    data += bh.bytes;
    --missing->second;
  }
  // An update running now (this push arrived while it served fetches) finishes its step first.
  if (!updating_) finish_completed_steps();
}

// Stores one pushed gradient block; with its last contribution the block's gradient is summed
// in source-rank order and its sum of squares taken now, while other pushes are still on their
// way, so that a step's end leaves only the norm agreement and the update. A raw block is
// copied, checked and (if it is the only contribution) squared in one pass on the pool.
void HolderServer::take_contribution(int id, int source, std::int64_t step, const char* data,
                                     std::int64_t bytes, std::uint32_t crc) {
  auto it = owned_.find(id);
  PDT_CHECK(it != owned_.end(), "rank " + std::to_string(source) + " pushed block " +
                                    std::to_string(id) + " to a holder that does not own it");
  const std::string& name = table_.blocks[id].name;
  const auto n = static_cast<std::int64_t>(table_.blocks[id].numel);
  const std::string what = "the gradient of block " + name + " pushed by rank " +
                           std::to_string(source) + " for step " + std::to_string(step);
  StepGradient& g = it->second.grads[step];
  auto [slot, fresh] = g.by_source.try_emplace(source);
  PDT_CHECK(fresh && !g.complete, "rank " + std::to_string(source) + " pushed block " + name +
                                      " twice in step " + std::to_string(step));
  slot->second = take_buffer(static_cast<std::size_t>(n));
  WorkerPool* pool = updating_ ? nullptr : pool_.get();  // busy while an update runs
  const bool last = static_cast<int>(g.by_source.size()) == contributions_[id];
  const bool alone = last && g.by_source.size() == 1;
  if (push_codec_ == WireCodec::raw) {
    PDT_CHECK(bytes == n * static_cast<std::int64_t>(sizeof(float)), "cannot decode (raw) " + what);
    const std::uint32_t got =
        ingest_raw_gradient(pool, data, slot->second.data(), n, alone ? &g.sumsq : nullptr);
    PDT_CHECK(got == crc, "CRC mismatch in " + what);
  } else {
    PDT_CHECK(crc32c(data, static_cast<std::size_t>(bytes)) == crc, "CRC mismatch in " + what);
    PDT_CHECK(wire_decode(push_codec_, data, static_cast<std::size_t>(bytes), slot->second.data(),
                          n),
              std::string("cannot decode (") + to_string(push_codec_) + ") " + what);
  }
  if (!last) return;
  g.sum = std::move(g.by_source.begin()->second);
  if (!alone || push_codec_ != WireCodec::raw) {
    std::vector<const float*> others;
    for (auto s = std::next(g.by_source.begin()); s != g.by_source.end(); ++s)
      others.push_back(s->second.data());
    g.sumsq = reduce_gradient(pool, g.sum.data(), others, n);
  }
  for (auto s = std::next(g.by_source.begin()); s != g.by_source.end(); ++s)
    give_buffer(std::move(s->second));
  g.by_source.clear();
  g.complete = true;
}

// Steps complete in order: a later step's gradients may already be here.
void HolderServer::finish_completed_steps() {
  for (auto next = missing_.find(version_ + 1); next != missing_.end() && next->second == 0;
       next = missing_.find(version_ + 1)) {
    missing_.erase(next);
    finish_step();
  }
}

std::vector<float> HolderServer::take_buffer(std::size_t n) {
  std::optional<std::vector<float>> spare = spare_.take(n);
  return spare ? std::move(*spare) : std::vector<float>(n);
}

void HolderServer::give_buffer(std::vector<float> buffer) {
  if (!buffer.empty()) spare_.give(buffer.size(), std::move(buffer));
}

// All holders reach this point once per step; they agree on the global gradient norm, then
// update their blocks.
void HolderServer::finish_step() {
  // Every fetch of the version being replaced was answered before its step's gradients came;
  // waiting for the sends to finish lets the update reuse (or overwrite) the bytes they send.
  drain_sent_replies();
  ScopedPhase t(timers_, "update");
  TraceSpan span(trace_, "update v" + std::to_string(version_ + 1), "holder");
  const std::int64_t step = version_ + 1;
  const double norm = agree_on_norm(step);
  const double lr = learning_rate(opt_, step);
  const auto scale = static_cast<float>(clip_factor(opt_, norm));
  version_ = step;
  // Known before any block of the new version is served: every reply carries it, including the
  // ones served while the update runs (the reporting rank may see no other reply of this step).
  recent_[version_] = UpdateInfo{version_, norm, lr};
  recent_.erase(recent_.begin(), recent_.lower_bound(version_ - staleness_));
  if (diverged_at_ > 0) {  // not applied: the compute ranks stop once they learn the norm
    keep_blocks(step);
    serve_deferred();
    return;
  }
  update_blocks(step, lr, scale);
  if (hooks_.after_update) hooks_.after_update(version_, [this] { return owned_blocks(); });
  serve_deferred();
}

// The holders exchange per-block sums of squares and add them in block order, so the norm (and
// the clip) is the same for any number of holders.
double HolderServer::agree_on_norm(std::int64_t step) {
  std::vector<double> my_sumsq;
  for (auto& [id, o] : owned_) my_sumsq.push_back(o.grads.at(step).sumsq);
  // Gather every holder's per-block sums into block order.
  const int H = layout_.shape().holders;
  std::vector<int> counts(H, 0);
  for (int owner : owner_) ++counts[owner];
  const std::vector<int> displs = displacements(counts);
  std::vector<double> all(owner_.size());
  MPI_Request r;
  MPI_CHECK(MPI_Iallgatherv(my_sumsq.data(), static_cast<int>(my_sumsq.size()), MPI_DOUBLE,
                            all.data(), counts.data(), displs.data(), MPI_DOUBLE,
                            layout_.holders_comm(), &r));
  wait_quietly(&r);
  // Holder h's sums are its blocks in id order; put them back in block order, so the norm adds
  // up the same way for any placement.
  std::vector<double> by_block(owner_.size());
  std::vector<int> next(displs);
  for (std::size_t b = 0; b < owner_.size(); ++b) by_block[b] = all[next[owner_[b]]++];
  const double norm = global_norm(by_block);
  check_norm(step, norm, by_block);
  return norm;
}

// The divergence guard, on every holder alike (they hold the same per-block sums): a norm that
// is not finite stops every holder before it touches a parameter, naming the first block whose
// gradient is not finite and the holder that owns it.
void HolderServer::check_norm(std::int64_t step, double norm, const std::vector<double>& by_block) {
  if (diverged_at_ > 0 || std::isfinite(norm)) return;
  diverged_at_ = step;
  divergence_ = norm_divergence_message(step, norm, by_block, [this](int b) {
    return table_.blocks[b].name + " on holder " + std::to_string(owner_[b]) + " (world rank " +
           std::to_string(layout_.holder_world_rank(owner_[b])) + ")";
  });
}

// A step not applied (training diverged): its version is the previous parameters, so that the
// compute ranks' fetches of it are answered and the run ends in order.
void HolderServer::keep_blocks(std::int64_t step) {
  for (auto& [id, o] : owned_) {
    encode(o);  // as version_ (== step)
    give_buffer(std::move(o.grads.at(step).sum));
    o.grads.erase(step);
  }
}

// The fused update of every owned block on the pool. Meanwhile this thread publishes blocks in
// the order the next forward needs them (update_order_) as they complete, serves the fetches
// waiting for them, and keeps taking messages: the next step starts while this one updates.
// The order is the forward's because ids are tensor-major: in id order a layer's last block
// comes near the end of the update. Each block's update is its own: the order changes no bit.
void HolderServer::update_blocks(std::int64_t step, double lr, float scale) {
  std::vector<FusedUpdate::Block> blocks;
  std::vector<Encoded> fresh(owned_.size());
  std::size_t i = 0;
  for (auto& [id, op] : update_order_) {
    Owned& o = *op;
    // The version leaving the window lends its buffer (no reply can still be sending it).
    auto oldest = o.versions.begin();
    if (oldest != o.versions.end() && oldest->first < step - staleness_)
      fresh[i].storage = std::move(oldest->second.storage);
    o.versions.erase(o.versions.begin(), o.versions.lower_bound(step - staleness_));
    FusedUpdate::Block b;
    b.state = &o.state;
    b.grad = o.grads.at(step).sum.data();
    b.step = adamw_step(opt_, step, lr, scale, o.state.decay);
    if (segments_)
      b.wire_at = slot(o, step);  // the slot of the version leaving the window
    else
      b.encoded = serves_in_place() ? nullptr : &fresh[i].storage;
    b.predict = plan_.prediction(step);
    if (!b.predict.exact() && fetch_codec_ == WireCodec::lz4) b.predicted = &o.predicted;
    blocks.push_back(b);
    ++i;
  }
  FusedUpdate update(fetch_codec_, std::move(blocks));
  updating_ = true;
  // With one update thread this thread is it: it runs the slices itself between messages. A
  // worker woken for them on a node with no free core takes this thread's core, and nothing is
  // published (the next forward waits) until the worker is done.
  const bool alone = pool_->threads() <= 1;
  if (!alone) update.start(*pool_);
  for (std::size_t b = 0; b < update.size();) {
    const std::int64_t seen = update.completed();
    const std::size_t first = b;
    for (; b < update.size() && update.done(b); ++b)
      publish(*update_order_[b].second, step, std::move(fresh[b]), update.block(b).crc);
    if (b > first && !deferred_.empty()) serve_deferred();
    if (b == update.size()) break;
    retire_sent_replies();
    // Between messages this thread updates slices itself rather than wait for the workers.
    if (poll_once()) continue;
    if (alone ? update.run_next_here() : pool_->help()) continue;
    update.wait_for_progress(seen, std::chrono::microseconds(200));
  }
  if (!alone) pool_->wait();
  updating_ = false;
  for (auto& [id, o] : owned_) {
    give_buffer(std::move(o.grads.at(step).sum));
    o.grads.erase(step);
  }
}

// Whether every block a fetch request names exists at the requested version. During an update
// blocks reach the new version one by one, in block order (the order the next forward needs
// them), and waiting fetches are served as soon as theirs are ready.
bool HolderServer::ready(const wire::RequestView& request) const {
  const std::int64_t v = request.head().version;
  if (v > version_) return false;
  for (std::int64_t i = 0; i < request.n(); ++i)
    if (!owned_.at(request.entry(i)).versions.count(v)) return false;
  return true;
}

void HolderServer::serve_deferred() {
  std::deque<Pending> still;
  for (Pending& p : deferred_) {
    const wire::RequestView request(p.msg, "rank " + std::to_string(p.source));
    if (ready(request))
      serve_fetch(p.source, request);
    else
      still.push_back(std::move(p));
  }
  deferred_.swap(still);
}

// One line per holder: what it served and took, in all and per step, so egress can be compared
// across data-parallel widths.
void HolderServer::print_traffic() const {
  const double steps = static_cast<double>(std::max<std::int64_t>(1, version_ - start_version_));
  std::printf("holder %d: egress %.3f MiB/step (%.3f through shared memory), ingress %.3f "
              "MiB/step (%lld steps, update %.2f s, serve %.2f s)\n",
              layout_.holder_index(), static_cast<double>(sent_) / steps / 1048576.0,
              static_cast<double>(sent_shared_) / steps / 1048576.0,
              static_cast<double>(received_) / steps / 1048576.0,
              static_cast<long long>(version_ - start_version_), timers_.get("update"),
              timers_.get("serve"));
  std::fflush(stdout);
}

void HolderServer::send_final_crc() {
  // Holder 0 gathers all blocks (in block order) and computes the canonical CRC.
  std::vector<float> mine;
  for (auto& [id, o] : owned_) mine.insert(mine.end(), o.state.param.begin(), o.state.param.end());
  const int H = layout_.shape().holders;
  std::vector<int> counts(H, 0);
  for (std::size_t b = 0; b < owner_.size(); ++b)
    counts[owner_[b]] += static_cast<int>(table_.blocks[b].numel);
  const std::vector<int> displs = displacements(counts);
  const bool root = layout_.holder_index() == 0;
  std::vector<float> all(root ? static_cast<std::size_t>(displs[H - 1] + counts[H - 1]) : 0);
  MPI_Request r;
  MPI_CHECK(MPI_Igatherv(mine.data(), static_cast<int>(mine.size()), MPI_FLOAT, all.data(),
                         counts.data(), displs.data(), MPI_FLOAT, 0, layout_.holders_comm(), &r));
  wait_quietly(&r);
  if (!root) return;
  // Holder h's data is its blocks in id order, at displs[h]; placement need not be contiguous.
  std::vector<const float*> ptrs(owner_.size());
  std::vector<std::int64_t> next(displs.begin(), displs.end());
  for (std::size_t b = 0; b < owner_.size(); ++b) {
    ptrs[b] = all.data() + next[owner_[b]];
    next[owner_[b]] += table_.blocks[b].numel;
  }
  std::uint32_t crc = table_.canonical_crc(ptrs);
  MPI_CHECK(MPI_Send(&crc, 1, MPI_UINT32_T, layout_.reporter_world_rank(), wire::kFinalCrc,
                     layout_.world()));
}

}  // namespace pdtrain
