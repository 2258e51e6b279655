#include "pdtrain/device/host_staging.hpp"

namespace pdtrain {

float* HostStaging::buffer(std::int64_t n) {
  if (pinned_.size() < n) {
    device_.synchronize();  // an upload may still read the old buffer
    pinned_ = Buffer<float>(device_, n, MemoryKind::pinned);
  }
  return pinned_.data();
}

const float* HostStaging::download(const float* data, std::int64_t n) {
  if (device_.is_host()) return data;
  float* host = buffer(n);
  device_.copy(host, data, static_cast<std::size_t>(n) * sizeof(float));
  device_.synchronize();
  return host;
}

void HostStaging::upload(float* data, const float* host, std::int64_t n) {
  if (host != data) device_.copy(data, host, static_cast<std::size_t>(n) * sizeof(float));
}

template <class Collective>
void StagedTensorParallel::staged(float* data, std::int64_t n, Collective&& collective) {
  if (group_.size() == 1 || n == 0) return;
  // On the CPU, download passes `data` itself through and upload is then a no-op.
  float* host = const_cast<float*>(staging_.download(data, n));
  collective(host, n);
  staging_.upload(data, host, n);
}

void StagedTensorParallel::allreduce_sum(float* data, std::int64_t n) {
  staged(data, n, [this](float* d, std::int64_t m) { group_.allreduce_sum(d, m); });
}

void StagedTensorParallel::allreduce_max(float* data, std::int64_t n) {
  staged(data, n, [this](float* d, std::int64_t m) { group_.allreduce_max(d, m); });
}

}  // namespace pdtrain
