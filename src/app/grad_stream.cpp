#include "pdtrain/app/grad_stream.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "pdtrain/core/error.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/model/stage_program.hpp"

namespace pdtrain {

namespace {

// grads_end() calls per unit in one backward pass.
std::vector<int> writes_per_pass(const StageParams& p) {
  std::vector<int> n(static_cast<std::size_t>(p.num_units()), 0);
  for (const std::vector<int>& use : StageProgram(p).backward_grad_uses())
    for (int u : use) ++n[u];
  return n;
}

// The blocks of unit u whose gradient this rank pushes (after the data-parallel reduce), in
// catalogue order.
std::vector<int> pushed_blocks_of(const StageParams& p, int u) {
  std::vector<int> out;
  for (int b : p.unit_blocks(u))
    if (p.pushes(p.catalog().block(b))) out.push_back(b);
  return out;
}

// The reducer's groups: each unit's pushed blocks, for the units that have any.
std::vector<std::vector<int>> push_groups(const StageParams& p) {
  std::vector<std::vector<int>> groups;
  for (int u = 0; u < p.num_units(); ++u) {
    std::vector<int> blocks = pushed_blocks_of(p, u);
    if (!blocks.empty()) groups.push_back(std::move(blocks));
  }
  return groups;
}

std::vector<std::int64_t> block_numel(const ParamCatalog& cat) {
  std::vector<std::int64_t> numel;
  for (const BlockInfo& b : cat.blocks()) numel.push_back(b.numel());
  return numel;
}

std::int64_t pushed_numel(const StageParams& p, int u) {
  std::int64_t n = 0;
  for (int b : pushed_blocks_of(p, u)) n += p.catalog().block(b).numel();
  return n;
}

}  // namespace

std::int64_t GradStreamer::PoolCounts::take(std::int64_t n) {
  auto it = free_.find(n);
  if (it == free_.end() || it->second == 0) return n;
  --it->second;
  return 0;
}

// Replays one step's backward with the rank's own pool arithmetic, assuming no push finishes
// before it must (the worst case): gradient memory bound at a unit's first write; at its last
// (staged: at the next unit's last, when its download is waited for), a packed unit takes a
// packed buffer and gives its gradient memory back, an in-place one keeps it until its push is
// retired, which happens when a push beyond `pushes_in_flight` needs room (with 0, at once).
// Reduced on the device, a layer takes its packed buffer and gives its gradient memory back at
// its last write (the gather), and the buffer (or an in-place unit's memory) is on the wire
// from the next unit's last write. Pools never shrink and every step repeats the same order, so
// the first step's peak is the run's.
std::int64_t GradStreamer::bound_bytes(const StageParams& p, int passes, int replicas,
                                       int pushes_in_flight, bool staged, bool reduce_on_device) {
  reduce_on_device = reduce_on_device && staged && replicas > 1;  // GradReducer::on_device()
  const std::vector<int> per_pass = writes_per_pass(p);
  std::vector<int> written(per_pass.size(), 0);
  std::vector<bool> bound(per_pass.size(), false);
  PoolCounts grads, packed;
  struct OnWire {
    bool in_place;
    std::int64_t n;
  };
  std::deque<OnWire> in_flight;
  int downloading = -1;
  std::int64_t held = 0, peak = 0;
  const auto add = [&](std::int64_t floats) {
    held += 4 * floats;
    peak = std::max(peak, held);
  };
  const auto retire_oldest = [&] {
    const OnWire& old = in_flight.front();
    (old.in_place ? grads : packed).give(old.n);
    in_flight.pop_front();
  };
  const auto push = [&](int u) {
    if (pushes_in_flight > 0 && static_cast<int>(in_flight.size()) == pushes_in_flight)
      retire_oldest();
    const bool from_tiles = pushes_in_flight == 0 && replicas == 1;  // sends_from_tiles()
    if (p.unit_is_packed(u, pushed_blocks_of(p, u)) || from_tiles) {
      in_flight.push_back({true, p.unit_numel(u)});
    } else {
      const std::int64_t n = pushed_numel(p, u);
      add(packed.take(n));
      grads.give(p.unit_numel(u));
      in_flight.push_back({false, n});
    }
    if (pushes_in_flight == 0) retire_oldest();
  };
  const auto reduce_on_gpu = [&](int u) {  // download_my_segment()
    if (p.unit_is_packed(u, pushed_blocks_of(p, u))) return;
    add(packed.take(pushed_numel(p, u)));
    grads.give(p.unit_numel(u));
  };
  const auto push_segment = [&](int u) {
    if (pushes_in_flight > 0 && static_cast<int>(in_flight.size()) == pushes_in_flight)
      retire_oldest();
    const bool in_place = p.unit_is_packed(u, pushed_blocks_of(p, u));
    in_flight.push_back({in_place, in_place ? p.unit_numel(u) : pushed_numel(p, u)});
    if (pushes_in_flight == 0) retire_oldest();
  };
  for (int pass = 0; pass < passes; ++pass)
    for (const std::vector<int>& use : StageProgram(p).backward_grad_uses()) {
      for (int u : use)
        if (!bound[u]) {
          bound[u] = true;
          add(grads.take(p.unit_numel(u)));
        }
      for (int u : use) {
        if (++written[u] < passes * per_pass[u]) continue;
        if (pushed_numel(p, u) == 0) {
          grads.give(p.unit_numel(u));
        } else if (!staged) {
          push(u);
        } else if (reduce_on_device) {
          reduce_on_gpu(u);
          if (downloading >= 0) push_segment(downloading);
          downloading = u;
        } else {
          if (downloading >= 0) push(downloading);
          downloading = u;
        }
      }
    }
  return peak;
}

std::int64_t GradStreamer::bound_bytes(const StageParams& p, int passes, int replicas,
                                       int pushes_in_flight, bool staged) {
  return std::max(bound_bytes(p, passes, replicas, pushes_in_flight, staged, false),
                  bound_bytes(p, passes, replicas, pushes_in_flight, staged, true));
}

GradStreamer::GradStreamer(StageParams& params, ParameterService& service,
                           kernels::KernelOps& ops, MPI_Comm dp_comm, Collectives* dp_on_device,
                           int passes, int pushes_in_flight, TraceRecorder* trace)
    : params_(params), service_(service), ops_(ops), device_(params.device()), trace_(trace),
      passes_(passes), pushes_in_flight_(pushes_in_flight), replicas_(comm_size(dp_comm)),
      bound_bytes_(bound_bytes(params, passes, replicas_, pushes_in_flight,
                               !params.device().is_host(), dp_on_device != nullptr)),
      writes_per_pass_(writes_per_pass(params)),
      group_of_unit_(static_cast<std::size_t>(params.num_units()), -1),
      in_place_(static_cast<std::size_t>(params.num_units()), false),
      tiles_(static_cast<std::size_t>(params.num_units())),
      reducer_(dp_comm, push_groups(params), block_numel(params.catalog()), dp_on_device),
      written_(static_cast<std::size_t>(params.num_units()), 0),
      final_(static_cast<std::size_t>(params.num_units()), false),
      bound_(static_cast<std::size_t>(params.num_units())) {
  PDT_CHECK(passes >= 1, "a step has at least one backward pass");
  PDT_CHECK(pushes_in_flight >= 0, "pushes in flight cannot be negative");
  int group = 0;
  for (int u = 0; u < params.num_units(); ++u) {
    const std::vector<int> blocks = pushed_blocks_of(params, u);
    if (blocks.empty()) continue;
    group_of_unit_[u] = group++;  // push_groups' order
    in_place_[u] = params.unit_is_packed(u, blocks);
  }
  params_.set_grad_user(this);
}

GradStreamer::~GradStreamer() {
  params_.set_grad_user(nullptr);
  for (int u = 0; u < params_.num_units(); ++u) params_.bind_unit_grads(u, nullptr, nullptr);
}

void GradStreamer::begin_step(std::int64_t step) {
  step_ = step;
  std::fill(written_.begin(), written_.end(), 0);
  std::fill(final_.begin(), final_.end(), false);
}

void GradStreamer::grads_begin(const std::vector<int>& units) {
  for (int u : units)
    if (bound_[u].empty()) bind(u);
}

void GradStreamer::grads_end(const std::vector<int>& units) {
  for (int u : units) {
    PDT_CHECK(!final_[u], "gradients of unit " + params_.unit_name(u) +
                              " written after its last backward of step " +
                              std::to_string(step_));
    if (++written_[u] == passes_ * writes_per_pass_[u]) release(u);
  }
}

double GradStreamer::end_step() {
  for (int u = 0; u < params_.num_units(); ++u)
    PDT_CHECK(final_[u] || writes_per_pass_[u] == 0,
              "step " + std::to_string(step_) + " ended before the last backward of unit " +
                  params_.unit_name(u));
  const double t0 = now_seconds();
  finish_download();
  retire_pushes(0);
  return now_seconds() - t0;
}

// Zeroed gradient memory for unit u, from the pool when one of its size is free.
void GradStreamer::bind(int u) {
  const std::int64_t n = params_.unit_numel(u);
  count(4 * pool_counts_.take(n));
  if (std::optional<Mirrored<float>> spare = free_.take(static_cast<std::size_t>(n))) {
    bound_[u] = std::move(*spare);
    device_.zero(bound_[u].device(), static_cast<std::size_t>(n) * sizeof(float));
  } else {
    const AllocationLabel label(device_, "the gradients of unit " + params_.unit_name(u));
    bound_[u] = Mirrored<float>(device_, n);  // zero-filled
  }
  params_.bind_unit_grads(u, bound_[u].device(), bound_[u].host());
}

void GradStreamer::release(int u) {
  const double t0 = now_seconds();
  final_[u] = true;
  params_.bind_unit_grads(u, nullptr, nullptr);
  Mirrored<float> grads = std::move(bound_[u]);
  if (group_of_unit_[u] < 0) {  // nothing of it is this rank's to push (tp-replicated)
    give_grads(std::move(grads));
  } else if (device_.is_host()) {
    push_unit(u, std::move(grads));
  } else if (reducer_.on_device()) {
    download_my_segment(u, std::move(grads));
  } else {
    download_unit(u, std::move(grads));
  }
  stream_seconds_ += now_seconds() - t0;
}

// Downloads copy the front `floats` of `from`'s device memory to its host view on the copy queue
// once the compute queue has finished the work queued so far (the backward, the reduce); the
// previous unit's download, queued one unit earlier, is pushed meanwhile.
namespace {
std::unique_ptr<Event> queue_download(Device& device, Mirrored<float>& from, std::int64_t floats) {
  const std::unique_ptr<Event> computed = device.make_event();
  device.record(*computed, Queue::compute);
  device.wait(Queue::copy, *computed);
  device.copy(from.host(), from.device(), static_cast<std::size_t>(floats) * sizeof(float),
              Queue::copy);
  std::unique_ptr<Event> done = device.make_event();
  device.record(*done, Queue::copy);
  return done;
}
}  // namespace

// The whole unit crosses to the host, to be (packed,) reduced and pushed there.
void GradStreamer::download_unit(int u, Mirrored<float> grads) {
  std::unique_ptr<Event> done = queue_download(device_, grads, grads.size());
  finish_download();
  downloading_ = Downloading{u, std::move(grads), {}, false, std::move(done)};
}

// NCCL: the replicas reduce-scatter the unit's pushed blocks on their GPUs, packed in the
// reducer's order (each element added in replica order: the host path's bits), and only this
// replica's reduced segment crosses to the host.
void GradStreamer::download_my_segment(int u, Mirrored<float> grads) {
  const int g = group_of_unit_[u];
  Mirrored<float> packed;
  if (!in_place_[u]) {
    packed = take_device_packed(reducer_.total_numel(g));
    ops_.optimizer().gather_tiles(packed.device(), grads.device(), device_tiles(u, grads.device()));
    give_grads(std::move(grads));  // its next use (bind's zeroing) is queued after the gather
  }
  Mirrored<float>& reduced = in_place_[u] ? grads : packed;
  const float* mine = reducer_.reduce_scatter_on_device(reduced.device(), g);
  // The sum lies in the collectives' scratch, which their next operation reuses: to the front
  // of `reduced` on the compute queue (ordered after the reduce-scatter has read it).
  const std::int64_t n = reducer_.my_numel(g);
  device_.copy(reduced.device(), mine, static_cast<std::size_t>(n) * sizeof(float));
  std::unique_ptr<Event> done = queue_download(device_, reduced, n);
  finish_download();
  downloading_ = Downloading{u, std::move(grads), std::move(packed), true, std::move(done)};
}

// Unit u's pushed blocks where they lie in its gradient memory at `grads`, in the reducer's
// order: the tiles gather_tiles packs as push_unit packs on the host.
const std::vector<kernels::KernelOps::Tile>& GradStreamer::device_tiles(int u, const float* grads) {
  std::vector<kernels::KernelOps::Tile>& tiles = tiles_[u];
  if (!tiles.empty()) return tiles;
  const char* base = reinterpret_cast<const char*>(grads);
  for (int b : reducer_.blocks(group_of_unit_[u])) {
    const ConstBlockPlace place = params_.grad_place(params_.catalog().block(b), grads);
    tiles.push_back({(place.data - base) / 4, place.rows, place.row_bytes / 4,
                     place.stride_bytes / 4});
  }
  return tiles;
}

void GradStreamer::finish_download() {
  if (downloading_.unit < 0) return;
  device_.wait_host(*downloading_.done);
  Downloading d = std::move(downloading_);
  downloading_ = Downloading{};
  if (d.reduced)
    push_segment(d.unit, std::move(d.grads), std::move(d.device_packed));
  else
    push_unit(d.unit, std::move(d.grads));
}

void GradStreamer::push_unit(int u, Mirrored<float> grads) {
  // The name is built only when a trace is written (this runs once per unit and step).
  TraceSpan span(trace_, trace_ ? "push " + params_.unit_name(u) : std::string(), "pd");
  const int g = group_of_unit_[u];
  if (pushes_in_flight_ > 0) retire_pushes(static_cast<std::size_t>(pushes_in_flight_ - 1));
  // The push (and the reduction) needs the blocks back to back: a unit whose storage is its
  // blocks in order goes as it is, a layer is packed and its gradient memory is free at once.
  Push push;
  float* data = grads.host();
  if (sends_from_tiles(u)) {  // no packing copy: the push goes from the unit's tiles
    std::vector<ConstBlockPlace> places;
    for (int b : reducer_.blocks(g)) places.push_back(params_.grad_place(params_.catalog().block(b), data));
    push.ticket = service_.start_push_from(step_, reducer_.blocks(g), places);
    push.grads = std::move(grads);
    pushes_.push_back(std::move(push));
    retire_pushes(0);  // the least memory: backward waits for it
    return;
  }
  if (in_place_[u]) {
    push.grads = std::move(grads);
  } else {
    push.packed = take_packed(reducer_.total_numel(g));
    char* p = reinterpret_cast<char*>(push.packed.data());
    for (int b : reducer_.blocks(g))
      p = pack_rows(params_.grad_place(params_.catalog().block(b), data), p);
    give_grads(std::move(grads));
    data = push.packed.data();
  }
  start(std::move(push), g, data);
}

void GradStreamer::push_segment(int u, Mirrored<float> grads, Mirrored<float> device_packed) {
  TraceSpan span(trace_, trace_ ? "push " + params_.unit_name(u) : std::string(), "pd");
  if (pushes_in_flight_ > 0) retire_pushes(static_cast<std::size_t>(pushes_in_flight_ - 1));
  Push push;
  push.grads = std::move(grads);
  push.device_packed = std::move(device_packed);
  float* data = push.device_packed.empty() ? push.grads.host() : push.device_packed.host();
  start(std::move(push), group_of_unit_[u], data);
}

void GradStreamer::start(Push push, int g, float* data) {
  if (reduce_and_start_push(g, data, &push.ticket))
    pushes_.push_back(std::move(push));
  else
    recycle(push);
  if (pushes_in_flight_ == 0) retire_pushes(0);  // the least memory: backward waits for it
}

// With no push in flight and one replica, a layer's gradient goes to its holders straight from
// its tiles (the push waits anyway, so MPI may move a datatype while it does): no packed copy is
// held, and the unit's memory is free again before the next unit is bound.
bool GradStreamer::sends_from_tiles(int u) const {
  return pushes_in_flight_ == 0 && replicas_ == 1 && !in_place_[u];
}

// Collective over the replicas: every replica releases its units in the same order. This
// replica's reduced segment is copied to the front of `data`, which the push is sent from.
// With one replica there is nothing to add.
bool GradStreamer::reduce_and_start_push(int g, float* data,
                                         ParameterService::PushTicket* ticket) {
  if (replicas_ == 1) {
    *ticket = service_.start_push(step_, reducer_.blocks(g), data);
    return true;
  }
  // Reduce-scattered on the device already (NCCL): `data` is this replica's segment.
  const float* mine = reducer_.on_device() ? data : reducer_.reduce_scatter(data, g);
  if (mine != data)
    std::memmove(data, mine, static_cast<std::size_t>(reducer_.my_numel(g)) * sizeof(float));
  if (reducer_.my_blocks(g).empty()) return false;
  *ticket = service_.start_push(step_, reducer_.my_blocks(g), data);
  return true;
}

// Waits until at most `keep` pushes are on their way (those done already are freed first).
void GradStreamer::retire_pushes(std::size_t keep) {
  while (!pushes_.empty() &&
         (pushes_.size() > keep || service_.push_done(pushes_.front().ticket))) {
    if (pushes_.size() > keep) service_.wait_push(pushes_.front().ticket);
    recycle(pushes_.front());
    pushes_.pop_front();
  }
}

void GradStreamer::recycle(Push& push) {
  if (!push.grads.empty()) give_grads(std::move(push.grads));
  if (!push.packed.empty()) {
    packed_counts_.give(static_cast<std::int64_t>(push.packed.size()));
    spare_packed_.give(push.packed.size(), std::move(push.packed));
  }
  if (!push.device_packed.empty()) {
    packed_counts_.give(push.device_packed.size());
    spare_device_packed_.give(static_cast<std::size_t>(push.device_packed.size()),
                              std::move(push.device_packed));
  }
}

void GradStreamer::give_grads(Mirrored<float> grads) {
  const std::int64_t n = grads.size();
  pool_counts_.give(n);
  free_.give(static_cast<std::size_t>(n), std::move(grads));
}

// A packed buffer of exactly n floats: a spare one of that size, or a new one.
std::vector<float> GradStreamer::take_packed(std::int64_t n) {
  count(4 * packed_counts_.take(n));
  std::optional<std::vector<float>> spare = spare_packed_.take(static_cast<std::size_t>(n));
  return spare ? std::move(*spare) : std::vector<float>(static_cast<std::size_t>(n));
}

// A packed device buffer (with its pinned host view) of exactly n floats, as take_packed.
Mirrored<float> GradStreamer::take_device_packed(std::int64_t n) {
  count(4 * packed_counts_.take(n));
  if (std::optional<Mirrored<float>> spare = spare_device_packed_.take(static_cast<std::size_t>(n)))
    return std::move(*spare);
  const AllocationLabel label(device_, "a packed gradient buffer");
  return Mirrored<float>(device_, n);
}

void GradStreamer::count(std::int64_t delta_bytes) {
  held_ += delta_bytes;
  peak_ = std::max(peak_, held_);
}

}  // namespace pdtrain
