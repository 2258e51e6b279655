#include "pdtrain/app/model_init.hpp"

#include <algorithm>
#include <cstdint>

#include "pdtrain/core/error.hpp"
#include "pdtrain/interop/hf_gpt2.hpp"
#include "pdtrain/model/llmc_format.hpp"

namespace pdtrain {
namespace {

// One model key and what the file says of it.
struct FileField {
  const char* deck_key;
  std::int64_t ModelConfig::*member;
  const char* file_key;
  std::int64_t value;
};

std::vector<FileField> file_fields(const InitFile& init) {
  using M = ModelConfig;
  if (init.kind == InitFile::Kind::llmc) {
    const LlmcHeader h = read_llmc_header(init.path);
    return {{"model.n_layer", &M::n_layer, "num_layers", h.n_layer},
            {"model.n_head", &M::n_head, "num_heads", h.n_head},
            {"model.d_model", &M::d_model, "channels", h.channels},
            {"model.vocab_size", &M::vocab_size, "vocab_size", h.vocab_size},
            {"model.padded_vocab_size", &M::padded_vocab_size, "padded_vocab_size",
             h.padded_vocab_size},
            {"model.max_seq_len", &M::max_seq_len, "max_seq_len", h.max_seq_len}};
  }
  const HfGpt2Config c = read_hf_config(init.path);
  return {{"model.n_layer", &M::n_layer, "n_layer", c.n_layer},
          {"model.n_head", &M::n_head, "n_head", c.n_head},
          {"model.d_model", &M::d_model, "n_embd", c.n_embd},
          {"model.vocab_size", &M::vocab_size, "vocab_size", c.vocab_size},
          {"model.max_seq_len", &M::max_seq_len, "n_positions", c.n_positions}};
}

// Set by the user: in their deck or by --set. The embedded default deck's values are defaults
// too: a run of it from a file takes the file's model.
bool set_in_deck(const Deck& d, const std::string& key) {
  const auto it = d.origin.find(key);
  return it != d.origin.end() && it->second != "default" &&
         it->second.rfind(std::string(kDefaultDeckName) + ":", 0) != 0;
}

std::string file_name(const InitFile& init) {
  return init.kind == InitFile::Kind::hf ? init.path + "/config.json" : init.path;
}

}  // namespace

InitFile init_file(const Deck& d) {
  const std::string& i = d.model.init;
  if (i.rfind("llmc:", 0) == 0) return {InitFile::Kind::llmc, i.substr(5)};
  if (i.rfind("hf:", 0) == 0) return {InitFile::Kind::hf, i.substr(3)};
  return {};
}

Deck with_model_of_init(const Deck& deck) {
  const InitFile init = init_file(deck);
  if (init.kind == InitFile::Kind::none) return deck;
  Deck d = deck;
  const std::string from = "model.init " + file_name(init);
  for (const FileField& f : file_fields(init)) {
    std::int64_t& v = d.model.*f.member;
    // 0 means "from the file" for the keys that have it (padded vocabulary, positions).
    if (set_in_deck(d, f.deck_key) && v != 0 && v != f.value)
      throw Error(ExitCode::data, d.where(f.deck_key) + ": " + f.deck_key + " = " +
                                      std::to_string(v) + " in the deck but " + f.file_key +
                                      " = " + std::to_string(f.value) + " in " + file_name(init));
    if (v != f.value) d.origin[f.deck_key] = from;
    v = f.value;
  }
  if (!set_in_deck(d, "model.seq_len") && d.model.seq_len > d.model.max_seq_len) {
    d.model.seq_len = d.model.max_seq_len;
    d.origin["model.seq_len"] = from;
  }
  if (d.model.seq_len > d.model.max_seq_len)
    throw Error(ExitCode::data, d.where("model.seq_len") + ": model.seq_len = " +
                                    std::to_string(d.model.seq_len) +
                                    " in the deck exceeds the " +
                                    std::to_string(d.model.max_seq_len) + " positions of " +
                                    file_name(init));
  check_deck_rules(d);  // e.g. the synthetic source's copy lag within the file's positions
  return d;
}

void read_init_params(const InitFile& init, const ParamCatalog& cat, std::vector<float>& canonical) {
  if (init.kind == InitFile::Kind::llmc) read_llmc_params(init.path, cat, canonical);
  if (init.kind == InitFile::Kind::hf) read_hf_params(init.path, cat, canonical);
}

}  // namespace pdtrain
