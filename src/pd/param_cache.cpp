#include "pdtrain/pd/param_cache.hpp"

#include <algorithm>

#include "pdtrain/core/error.hpp"
#include "pdtrain/core/timer.hpp"

namespace pdtrain {

namespace {
constexpr std::size_t npos = static_cast<std::size_t>(-1);
std::int64_t bytes_of(std::int64_t numel) { return numel * static_cast<std::int64_t>(sizeof(float)); }
}  // namespace

ParamCache::ParamCache(ParameterService& service, std::vector<CacheUnit> units, UnitStore& store,
                       std::int64_t capacity_bytes, int prefetch_depth, TraceRecorder* trace,
                       Device& device)
    : service_(service), device_(device), units_(std::move(units)), store_(store), capacity_(capacity_bytes),
      next_capacity_(capacity_bytes), depth_(prefetch_depth), trace_(trace), state_(units_.size()) {
  stats_.unit_uses.assign(units_.size(), 0);
  stats_.unit_fetches.assign(units_.size(), 0);
}

ParamCache::~ParamCache() {
  for (std::size_t u = 0; u < units_.size(); ++u)
    if (state_[u].slot) store_.bind(static_cast<int>(u), nullptr, nullptr);
  // Slots may still be read by queued compute work or written by an upload.
  device_.synchronize();
}

std::int64_t ParamCache::min_capacity_bytes(const std::vector<CacheUnit>& units,
                                            const std::vector<std::vector<int>>& plan) {
  std::int64_t most = 0;
  for (const auto& use : plan) {
    std::int64_t n = 0;
    for (int u : use) n += units[u].numel;
    most = std::max(most, bytes_of(n));
  }
  return most;
}

void ParamCache::begin(std::int64_t version, std::vector<std::vector<int>> plan) {
  PDT_CHECK(fifo_.empty(), "parameter cache: a pass began with fetches in flight");
  if (version != version_)
    for (std::size_t u = 0; u < units_.size(); ++u) {
      if (state_[u].slot) drop(static_cast<int>(u));
      state_[u].fetched_this_version = false;
    }
  version_ = version;
  plan_ = std::move(plan);
  pos_ = 0;
  pinned_.clear();
  apply_capacity();
  stats_.pass_peak_bytes = allocated_bytes_;
  prefetch();
}

// A tighter capacity evicts with the new pass's plan (Belady), before its first fetch.
void ParamCache::apply_capacity() {
  capacity_ = next_capacity_;
  if (capacity_ == 0) return;
  make_room(0, 0);  // only units of the pass's first use may stay above the bound, and they fit
  release_free_slots(0);
}

void ParamCache::acquire(const std::vector<int>& units) {
  PDT_CHECK(pos_ < plan_.size() && plan_[pos_] == units,
            "parameter cache: use " + std::to_string(pos_) + " of the pass is not the planned one "
            "(the model and its use plan disagree)");
  pinned_ = units;
  const std::size_t here = pos_++;
  for (int u : units) {
    State& s = state_[u];
    ++stats_.uses;
    ++stats_.unit_uses[u];
    if (s.slot && !s.in_flight) {
      ++stats_.hits;
      ready_for_compute(u);
      continue;
    }
    if (s.in_flight) {
      ++stats_.late;
    } else {
      ++stats_.misses;
      PDT_CHECK(start(u, here), "parameter cache of " + std::to_string(capacity_ >> 20) +
                                    " MiB cannot hold unit " + units_[u].name +
                                    " next to the units in use");
    }
    wait_for(u);
    ready_for_compute(u);
  }
  prefetch();
}

void ParamCache::end() {
  PDT_CHECK(pos_ == plan_.size() && fifo_.empty(),
            "parameter cache: the pass ended after " + std::to_string(pos_) + " of " +
                std::to_string(plan_.size()) + " planned uses");
  pinned_.clear();
}

std::size_t ParamCache::next_use(int unit, std::size_t from) const {
  for (std::size_t i = from; i < plan_.size(); ++i)
    if (std::find(plan_[i].begin(), plan_[i].end(), unit) != plan_[i].end()) return i;
  return npos;
}

// Evicts, farthest next use first, until `numel` more floats fit; never a unit in use, in
// flight, or needed no later than `needed_at`.
bool ParamCache::make_room(std::int64_t numel, std::size_t needed_at) {
  if (capacity_ == 0) return true;
  while (in_use_bytes_ + bytes_of(numel) > capacity_) {
    int victim = -1;
    std::size_t victim_next = 0;
    for (std::size_t u = 0; u < units_.size(); ++u) {
      const State& s = state_[u];
      if (!s.slot || s.in_flight) continue;
      if (std::find(pinned_.begin(), pinned_.end(), static_cast<int>(u)) != pinned_.end())
        continue;
      const std::size_t next = next_use(static_cast<int>(u), pos_);
      if (next != npos && next <= needed_at) continue;
      if (victim < 0 || next > victim_next) victim = static_cast<int>(u), victim_next = next;
    }
    if (victim < 0) return false;
    drop(victim);
  }
  return true;
}

bool ParamCache::start(int unit, std::size_t needed_at) {
  State& s = state_[unit];
  if (!make_room(units_[unit].numel, needed_at)) return false;
  s.slot = take_slot(units_[unit].numel);
  store_.bind(unit, s.slot->device(), s.slot->host());
  BlockTarget target{
      [this](int block, int width) { return store_.place(block, width); },
      [this](int block, int width, std::int64_t r0, std::int64_t r1) {
        store_.landed(block, width, r0, r1);
      }};
  s.ticket = service_.start_fetch_in_place(
      version_, units_[unit].blocks,
      [this](int block, const float* data) { store_.unpack(block, data); }, std::move(target));
  s.in_flight = true;
  s.started = now_seconds();
  s.version = version_;
  fifo_.push_back(unit);
  ++stats_.fetches;
  ++stats_.unit_fetches[unit];
  stats_.bytes_fetched += bytes_of(units_[unit].numel);
  if (s.fetched_this_version) stats_.bytes_refetched += bytes_of(units_[unit].numel);
  s.fetched_this_version = true;
  return true;
}

// Finishes fetches oldest first up to `unit`'s (they complete in the order they started).
void ParamCache::wait_for(int unit) {
  const double t0 = now_seconds();
  while (state_[unit].in_flight) {
    const int u = fifo_.front();
    service_.finish_fetch(state_[u].ticket);
    state_[u].in_flight = false;
    fifo_.erase(fifo_.begin());
    upload(u);
    if (tracing())  // names are built only when a trace is written (this runs per layer)
      trace_->event("fetch " + units_[u].name + " v" + std::to_string(version_), "pd",
                    state_[u].started, now_seconds());
  }
  const double t1 = now_seconds();
  stats_.wait_seconds += t1 - t0;
  if (tracing()) trace_->event("wait " + units_[unit].name, "pd", t0, t1);
}

// A delivered unit's staging to its device memory, on the copy queue (GPU only), once the
// compute queue is done with the slot's previous unit.
void ParamCache::upload(int unit) {
  Slot& slot = *state_[unit].slot;
  if (slot.staging.empty()) return;
  if (slot.release_pending) device_.wait(Queue::copy, *slot.released);
  slot.release_pending = false;
  device_.copy(slot.device(), slot.host(), static_cast<std::size_t>(bytes_of(slot.numel)),
               Queue::copy);
  device_.record(*slot.uploaded, Queue::copy);
  slot.upload_pending = slot.compute_waits = true;
}

// The compute queue's next work (the use of `unit`) waits for the unit's upload.
void ParamCache::ready_for_compute(int unit) {
  Slot& slot = *state_[unit].slot;
  if (!slot.compute_waits) return;
  device_.wait(Queue::compute, *slot.uploaded);
  slot.compute_waits = false;
}

// Starts the fetches of the units of the next `depth_` uses that are neither resident nor in
// flight, while there is room; then lets the fetches in flight progress.
void ParamCache::prefetch() {
  const std::size_t end = std::min(plan_.size(), pos_ + static_cast<std::size_t>(depth_));
  for (std::size_t i = pos_; i < end; ++i) {
    bool room = true;
    for (int u : plan_[i])
      if (!state_[u].slot && !(room = start(u, i))) break;
    if (!room) break;
  }
  service_.progress();
}

void ParamCache::drop(int unit) {
  State& s = state_[unit];
  PDT_CHECK(!s.in_flight, "parameter cache: dropping a unit in flight");
  store_.bind(unit, nullptr, nullptr);
  give_back(s.slot);
  s.slot = nullptr;
  s.version = -1;
}

// Slots are reused by size (a stage's layers are all alike), so steady state allocates
// nothing; free slots are released when the allocation would pass the capacity.
ParamCache::Slot* ParamCache::take_slot(std::int64_t numel) {
  in_use_bytes_ += bytes_of(numel);
  for (std::size_t i = 0; i < free_.size(); ++i)
    if (free_[i]->numel == numel) {
      used_.push_back(std::move(free_[i]));
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
      Slot& slot = *used_.back();
      if (slot.upload_pending) device_.wait_host(*slot.uploaded);  // staging is rewritten now
      slot.upload_pending = slot.compute_waits = false;
      return &slot;
    }
  release_free_slots(bytes_of(numel));
  const AllocationLabel label(device_, "a parameter cache slot of " + std::to_string(numel) +
                                           " floats (pd.cache_mb)");
  auto slot = std::make_unique<Slot>();
  slot->numel = numel;
  slot->storage = Buffer<float>(device_, numel, MemoryKind::device);
  if (!device_.is_host()) {
    slot->staging = Buffer<float>(device_, numel, MemoryKind::pinned);
    slot->uploaded = device_.make_event();
    slot->released = device_.make_event();
  }
  used_.push_back(std::move(slot));
  allocated_bytes_ += bytes_of(numel);
  stats_.peak_bytes = std::max(stats_.peak_bytes, allocated_bytes_);
  stats_.pass_peak_bytes = std::max(stats_.pass_peak_bytes, allocated_bytes_);
  return used_.back().get();
}

void ParamCache::release_free_slots(std::int64_t room) {
  while (capacity_ > 0 && !free_.empty() && allocated_bytes_ + room > capacity_) {
    allocated_bytes_ -= bytes_of(free_.back()->numel);
    if (free_.back()->release_pending) device_.wait_host(*free_.back()->released);
    free_.pop_back();
  }
}

// The compute queue may still read the slot's unit (its last use was queued, maybe not run):
// the next upload into it waits for this point.
void ParamCache::give_back(Slot* slot) {
  in_use_bytes_ -= bytes_of(slot->numel);
  if (slot->released) {
    device_.record(*slot->released, Queue::compute);
    slot->release_pending = true;
  }
  for (std::size_t i = 0; i < used_.size(); ++i)
    if (used_[i].get() == slot) {
      free_.push_back(std::move(used_[i]));
      used_.erase(used_.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
}

}  // namespace pdtrain
