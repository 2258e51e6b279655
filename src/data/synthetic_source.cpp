// Synthetic copy task: every token repeats the one copy_lag back with probability copy_prob,
// otherwise it is uniform. Only attention can exploit that, so a falling loss shows the
// attention path works; the exact entropy floor says how far the model is from perfect.
#include <cmath>
#include <cstdio>

#include "pdtrain/core/rng.hpp"
#include "pdtrain/data/sources.hpp"

namespace pdtrain::data {
namespace {

class SyntheticSource final : public TokenSource {
 public:
  explicit SyntheticSource(const SourceSpec& s)
      : seed_(static_cast<std::uint64_t>(s.seed)),
        vocab_(static_cast<std::uint64_t>(s.vocab_size)),
        seq_len_(s.seq_len),
        lag_(s.copy_lag),
        prob_(s.copy_prob) {}

  void train_sequences(std::int64_t step, std::int64_t first, std::int64_t count,
                       std::int32_t* out) const override {
    check_train_slice(step, first, count, out);
    for (std::int64_t i = 0; i < count; ++i)
      generate(rng_key(seed_, kTrainTag, static_cast<std::uint64_t>(step),
                       static_cast<std::uint64_t>(first + i)),
               out + i * (seq_len_ + 1));
  }

  // Keyed by the window index w alone, so the validation set is the same fixed (infinite)
  // sequence of windows whatever the batch size, like the file sources' windows.
  void val_sequences(std::int64_t batch, std::int64_t batch_size, std::int64_t first,
                     std::int64_t count, std::int32_t* out) const override {
    check_val_slice(batch, batch_size, first, count, out);
    for (std::int64_t i = 0; i < count; ++i) {
      const auto w = static_cast<std::uint64_t>(batch * batch_size + first + i);
      generate(rng_key(seed_, kValTag, w), out + i * (seq_len_ + 1));
    }
  }

  std::string describe() const override {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "synthetic copy task: vocab %llu, seq_len %lld, copy_lag %lld, copy_prob %g, "
                  "entropy floor %.4f nats/token (uniform %.4f)",
                  static_cast<unsigned long long>(vocab_), static_cast<long long>(seq_len_),
                  static_cast<long long>(lag_), prob_, *entropy_floor(),
                  std::log(static_cast<double>(vocab_)));
    return buf;
  }

  std::optional<double> entropy_floor() const override {
    return synthetic_entropy_floor(static_cast<std::int64_t>(vocab_), seq_len_, lag_, prob_);
  }

 private:
  // Token t draws counter 2t for the copy decision and 2t+1 for its uniform value.
  void generate(std::uint64_t key, std::int32_t* x) const {
    for (std::int64_t t = 0; t <= seq_len_; ++t) {
      const auto c = static_cast<std::uint64_t>(t);
      if (t >= lag_ && rng_uniform(key, 2 * c) < prob_)
        x[t] = x[t - lag_];
      else
        x[t] = static_cast<std::int32_t>(rng_below(key, 2 * c + 1, vocab_));
    }
  }

  std::uint64_t seed_, vocab_;
  std::int64_t seq_len_, lag_;
  double prob_;
};

}  // namespace

std::unique_ptr<TokenSource> make_synthetic_source(const SourceSpec& spec) {
  return std::make_unique<SyntheticSource>(spec);
}

}  // namespace pdtrain::data
