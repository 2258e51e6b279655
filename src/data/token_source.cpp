#include "pdtrain/data/token_source.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>

#include "pdtrain/core/error.hpp"
#include "pdtrain/data/sources.hpp"

namespace pdtrain::data {
namespace {

[[noreturn]] void bad_spec(const std::string& what) {
  throw Error(ExitCode::data, "data source: " + what);
}

void require(bool ok, const std::string& what) {
  if (!ok) bad_spec(what);
}

// Checks the fields every source relies on; file problems are found by the sources.
void validate(const SourceSpec& s) {
  constexpr auto kMaxVocab = std::int64_t{std::numeric_limits<std::int32_t>::max()};
  require(s.vocab_size >= 1 && s.vocab_size <= kMaxVocab,
          "vocab_size must be in [1, 2^31) (got " + std::to_string(s.vocab_size) + ")");
  require(s.seq_len >= 1, "seq_len must be >= 1 (got " + std::to_string(s.seq_len) + ")");
  require(s.batch_size >= 1,
          "batch_size must be >= 1 (got " + std::to_string(s.batch_size) + ")");
  if (s.kind == SourceKind::synthetic) {
    require(s.copy_lag >= 1, "copy_lag must be >= 1 (got " + std::to_string(s.copy_lag) + ")");
    require(s.copy_prob >= 0.0 && s.copy_prob <= 1.0,  // also rejects NaN
            "copy_prob must be in [0, 1] (got " + std::to_string(s.copy_prob) + ")");
    return;
  }
  require(!s.path.empty(), std::string("source '") + to_string(s.kind) + "' needs a path");
  if (s.val_path.empty())
    require(s.val_fraction > 0.0 && s.val_fraction < 1.0,
            "val_fraction must be in (0, 1) when val_path is empty (got " +
                std::to_string(s.val_fraction) + ")");
}

}  // namespace

std::optional<SourceKind> source_kind_from_string(const std::string& name) {
  if (name == "synthetic") return SourceKind::synthetic;
  if (name == "text") return SourceKind::text;
  if (name == "tokens") return SourceKind::tokens;
  return std::nullopt;
}

const char* to_string(SourceKind kind) {
  switch (kind) {
    case SourceKind::synthetic: return "synthetic";
    case SourceKind::text: return "text";
    case SourceKind::tokens: return "tokens";
  }
  return "unknown";
}

std::unique_ptr<TokenSource> make_token_source(const SourceSpec& spec) {
  validate(spec);
  switch (spec.kind) {
    case SourceKind::synthetic: return make_synthetic_source(spec);
    case SourceKind::text: return make_text_source(spec);
    case SourceKind::tokens: return make_tokens_source(spec);
  }
  bad_spec("unknown source kind " + std::to_string(static_cast<int>(spec.kind)));
}

void split_inputs_targets(const std::int32_t* sequences, std::int64_t count, std::int64_t seq_len,
                          std::int32_t* inputs, std::int32_t* targets) {
  for (std::int64_t i = 0; i < count; ++i)
    for (std::int64_t t = 0; t < seq_len; ++t) {
      inputs[i * seq_len + t] = sequences[i * (seq_len + 1) + t];
      targets[i * seq_len + t] = sequences[i * (seq_len + 1) + t + 1];
    }
}

double synthetic_entropy_floor(std::int64_t vocab_size, std::int64_t seq_len,
                               std::int64_t copy_lag, double copy_prob) {
  const double V = static_cast<double>(vocab_size);
  const double T = static_cast<double>(seq_len);
  const double p = copy_prob, q = (1.0 - p) / V;
  // 0 ln 0 = 0: with p = 1 the non-copied tokens never occur.
  const auto xlnx = [](double x) { return x > 0.0 ? x * std::log(x) : 0.0; };
  const double h_copy = -xlnx(p + q) - (V - 1.0) * xlnx(q);
  // Targets are x_1..x_T; x_1..x_{lag-1} have nothing to copy, x_lag..x_T do.
  const double uniform = static_cast<double>(std::min(copy_lag - 1, seq_len));
  const double copying = static_cast<double>(std::max<std::int64_t>(seq_len - copy_lag + 1, 0));
  return (uniform * std::log(V) + copying * h_copy) / T;
}

namespace {

[[noreturn]] void bad_call(const char* what, std::int64_t index, std::int64_t first,
                           std::int64_t count) {
  // A caller bug, not a data problem: the arguments come from the app, never from a file.
  throw std::invalid_argument(std::string(what) + ": bad arguments (index " +
                              std::to_string(index) + ", first " + std::to_string(first) +
                              ", count " + std::to_string(count) + ")");
}

}  // namespace

void check_train_slice(std::int64_t step, std::int64_t first, std::int64_t count,
                       const std::int32_t* out) {
  if (step < 0 || first < 0 || count < 0 || (count > 0 && out == nullptr))
    bad_call("train_sequences", step, first, count);
}

void check_val_slice(std::int64_t batch, std::int64_t batch_size, std::int64_t first,
                     std::int64_t count, const std::int32_t* out) {
  if (batch < 0 || batch_size < 1 || first < 0 || count < 0 || first + count > batch_size ||
      (count > 0 && out == nullptr))
    bad_call("val_sequences", batch, first, count);
}

}  // namespace pdtrain::data
