#pragma once
// Training and validation tokens. A batch is a pure function of (seed, step, sequence index):
// every rank computes exactly the sequences it needs, and the result does not depend on the
// rank count, the parallel layout or a restart. data/ knows nothing of MPI, decks or models.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace pdtrain::data {

enum class SourceKind { synthetic, text, tokens };

// "synthetic" | "text" | "tokens"; nullopt for anything else.
std::optional<SourceKind> source_kind_from_string(const std::string& name);
const char* to_string(SourceKind kind);

struct SourceSpec {            // filled by the app from the deck
  SourceKind kind = SourceKind::synthetic;
  std::string path{}, val_path{};  // text/tokens; val_path optional
  double val_fraction = 0.1;   // held-out tail of `path` when val_path is empty
  std::int64_t vocab_size = 64, seq_len = 64, seed = 1337;
  std::int64_t copy_lag = 8;   // synthetic
  double copy_prob = 0.75;     // synthetic
  std::int64_t batch_size = 8; // global sequences per step
};

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Writes `count` sequences of the global training batch of `step` (sequences
  // first..first+count-1), each seq_len+1 tokens (inputs are the first seq_len, targets the
  // last seq_len), into out[count*(seq_len+1)].
  virtual void train_sequences(std::int64_t step, std::int64_t first, std::int64_t count,
                               std::int32_t* out) const = 0;
  // Validation batch `batch` (0-based) of `batch_size` sequences: sequence j of it is held-out
  // window w = batch*batch_size + j, the w-th consecutive non-overlapping window (window w
  // starts at token w*seq_len and holds seq_len+1 tokens), wrapping modulo the number of whole
  // windows (llm.c's validation loss). Same first/count slicing as train_sequences.
  virtual void val_sequences(std::int64_t batch, std::int64_t batch_size, std::int64_t first,
                             std::int64_t count, std::int32_t* out) const = 0;
  // One line: kind, file, token counts, vocab.
  virtual std::string describe() const = 0;
  // Expected cross-entropy (nats per target token) of the best possible predictor, when known.
  virtual std::optional<double> entropy_floor() const { return std::nullopt; }
};

// The model's inputs and next-token targets of `count` sequences of seq_len+1 tokens each, as
// train_sequences() and val_sequences() write them: a sequence's first seq_len tokens are its
// inputs, its last seq_len its targets. inputs and targets are [count * seq_len].
void split_inputs_targets(const std::int32_t* sequences, std::int64_t count, std::int64_t seq_len,
                          std::int32_t* inputs, std::int32_t* targets);

// Validates the spec and opens the source. Throws pdtrain::Error(ExitCode::data, message) on
// any problem; the message names the file and the offending field or value.
std::unique_ptr<TokenSource> make_token_source(const SourceSpec& spec);

// Exact expected cross-entropy of the Bayes-optimal predictor on the synthetic copy task,
// averaged over the seq_len target positions x_1..x_T:
//   positions t < lag are uniform: ln V;
//   positions t >= lag: x_t = x_{t-lag} with probability p + q, any other token q = (1-p)/V,
//     H = -(p+q) ln(p+q) - (V-1) q ln q;
//   floor = (min(lag-1, T) ln V + max(T-lag+1, 0) H) / T.
double synthetic_entropy_floor(std::int64_t vocab_size, std::int64_t seq_len,
                               std::int64_t copy_lag, double copy_prob);

}  // namespace pdtrain::data
