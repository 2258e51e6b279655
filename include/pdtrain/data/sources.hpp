#pragma once
// The concrete sources behind make_token_source. They expect an already validated spec
// (make_token_source checks the fields every source shares); exposed for the factory and tests.
#include <memory>

#include "pdtrain/data/token_source.hpp"

namespace pdtrain::data {

std::unique_ptr<TokenSource> make_synthetic_source(const SourceSpec& spec);
std::unique_ptr<TokenSource> make_text_source(const SourceSpec& spec);
std::unique_ptr<TokenSource> make_tokens_source(const SourceSpec& spec);

// RNG purposes of the data layer: train and val draw from different streams, so a validation
// sequence never coincides with a training sequence by construction.
inline constexpr std::uint64_t kTrainTag = 0x646174612e74726eull;  // "data.trn"
inline constexpr std::uint64_t kValTag = 0x646174612e76616cull;    // "data.val"

// Throw std::invalid_argument for a caller bug: a negative step/batch/first/count, a null
// `out`, or (validation) a slice reaching past its batch of batch_size >= 1 sequences.
void check_train_slice(std::int64_t step, std::int64_t first, std::int64_t count,
                       const std::int32_t* out);
void check_val_slice(std::int64_t batch, std::int64_t batch_size, std::int64_t first,
                     std::int64_t count, const std::int32_t* out);

}  // namespace pdtrain::data
