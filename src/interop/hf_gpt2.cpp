#include "pdtrain/interop/hf_gpt2.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "pdtrain/core/error.hpp"
#include "pdtrain/interop/safetensors.hpp"
#include "pdtrain/io/output_file.hpp"

namespace pdtrain {
namespace {

using json = nlohmann::json;

[[noreturn]] void bad(const std::string& file, const std::string& what) {
  throw Error(ExitCode::data, file + ": " + what);
}

std::string config_path(const std::string& dir) { return dir + "/config.json"; }
std::string weights_path(const std::string& dir) { return dir + "/model.safetensors"; }

// Hugging Face's name of each llm.c tensor (after "transformer." and, per layer, "h.<l>."), and
// whether its weight is a Conv1D one, stored transposed ([in, out]).
struct HfName {
  const char* suffix;
  bool transposed;
};
HfName hf_name(TensorId id) {
  switch (id) {
    case TensorId::wte: return {"wte.weight", false};
    case TensorId::wpe: return {"wpe.weight", false};
    case TensorId::ln1w: return {"ln_1.weight", false};
    case TensorId::ln1b: return {"ln_1.bias", false};
    case TensorId::qkvw: return {"attn.c_attn.weight", true};
    case TensorId::qkvb: return {"attn.c_attn.bias", false};
    case TensorId::attprojw: return {"attn.c_proj.weight", true};
    case TensorId::attprojb: return {"attn.c_proj.bias", false};
    case TensorId::ln2w: return {"ln_2.weight", false};
    case TensorId::ln2b: return {"ln_2.bias", false};
    case TensorId::fcw: return {"mlp.c_fc.weight", true};
    case TensorId::fcb: return {"mlp.c_fc.bias", false};
    case TensorId::fcprojw: return {"mlp.c_proj.weight", true};
    case TensorId::fcprojb: return {"mlp.c_proj.bias", false};
    case TensorId::lnfw: return {"ln_f.weight", false};
    case TensorId::lnfb: return {"ln_f.bias", false};
    case TensorId::count: break;
  }
  throw Error(ExitCode::runtime, "hf_name: not a tensor");
}

// One layer's slice of one llm.c tensor as Hugging Face stores it.
struct HfTensor {
  std::string name;                 // without the "transformer." prefix
  std::vector<std::int64_t> shape;  // Hugging Face's
  std::int64_t rows, cols;          // llm.c's slice, [rows, cols] at `offset`
  std::int64_t offset;
  bool transposed;
};

// Every GPT-2 tensor of the catalogue, in llm.c's order (wte cut to vocab_size rows).
std::vector<HfTensor> hf_tensors(const ParamCatalog& cat) {
  std::vector<HfTensor> out;
  for (const TensorInfo& t : cat.tensors()) {
    const HfName n = hf_name(t.id);
    const std::int64_t rows = t.id == TensorId::wte ? cat.shape().vocab_size : t.rows;
    for (std::int64_t l = 0; l < t.layers; ++l) {
      HfTensor h;
      h.name = (t.per_layer ? "h." + std::to_string(l) + "." : std::string()) + n.suffix;
      h.rows = rows;
      h.cols = t.cols;
      h.offset = t.offset + l * t.rows * t.cols;
      h.transposed = n.transposed;
      if (t.cols == 1)
        h.shape = {rows};
      else
        h.shape = n.transposed ? std::vector<std::int64_t>{t.cols, rows}
                               : std::vector<std::int64_t>{rows, t.cols};
      out.push_back(std::move(h));
    }
  }
  return out;
}

std::string shape_text(const std::vector<std::int64_t>& s) { return json(s).dump(); }

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) bad(path, "cannot read (a Hugging Face model directory has config.json)");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return json::parse(text.str());
  } catch (const json::exception& e) {
    bad(path, std::string("not JSON: ") + e.what());
  }
}

std::int64_t positive_int(const json& c, const std::string& path, const char* key) {
  if (!c.contains(key)) bad(path, std::string("no ") + key + " (a GPT-2 config has it)");
  const json& v = c[key];
  if (!v.is_number_integer() || v.get<std::int64_t>() <= 0 || v.get<std::int64_t>() > (1 << 30))
    bad(path, std::string(key) + " = " + v.dump() + " is not a positive integer");
  return v.get<std::int64_t>();
}

// A key that, when present, must have the value GPT-2 (and pdtrain) computes with.
void require(const json& c, const std::string& path, const char* key, const json& want,
             const char* why) {
  if (c.contains(key) && !c[key].is_null() && c[key] != want)
    bad(path, std::string(key) + " = " + c[key].dump() + ", but pdtrain computes GPT-2 with " +
                  want.dump() + " (" + why + ")");
}

}  // namespace

HfGpt2Config read_hf_config(const std::string& dir) {
  const std::string path = config_path(dir);
  const json c = read_json(path);
  if (!c.is_object()) bad(path, "not a JSON object");
  if (!c.contains("model_type") || c["model_type"] != "gpt2")
    bad(path, "model_type = " + (c.contains("model_type") ? c["model_type"].dump() : "(none)") +
                  ", not a GPT-2 config (\"gpt2\")");
  HfGpt2Config g;
  g.n_layer = positive_int(c, path, "n_layer");
  g.n_head = positive_int(c, path, "n_head");
  g.n_embd = positive_int(c, path, "n_embd");
  g.vocab_size = positive_int(c, path, "vocab_size");
  g.n_positions = positive_int(c, path, "n_positions");
  if (g.n_embd % g.n_head != 0)
    bad(path, "n_embd = " + std::to_string(g.n_embd) + " is not divisible by n_head = " +
                  std::to_string(g.n_head));
  if (c.contains("activation_function") && c["activation_function"] != "gelu_new" &&
      c["activation_function"] != "gelu_pytorch_tanh")
    bad(path, "activation_function = " + c["activation_function"].dump() +
                  ", but pdtrain computes GPT-2's tanh GELU (\"gelu_new\")");
  if (c.contains("layer_norm_epsilon") &&
      (!c["layer_norm_epsilon"].is_number() ||
       std::abs(c["layer_norm_epsilon"].get<double>() - 1e-5) > 1e-12))
    bad(path, "layer_norm_epsilon = " + c["layer_norm_epsilon"].dump() +
                  ", but pdtrain's LayerNorm uses 1e-05");
  require(c, path, "n_inner", 4 * g.n_embd, "the MLP is 4 n_embd wide");
  require(c, path, "tie_word_embeddings", true, "the head is tied to wte");
  require(c, path, "add_cross_attention", false, "a decoder-only model");
  require(c, path, "scale_attn_weights", true, "attention scaled by 1/sqrt(head size)");
  require(c, path, "scale_attn_by_inverse_layer_idx", false, "no per-layer attention scaling");
  return g;
}

ModelShape shape_from_hf(const HfGpt2Config& c, std::int64_t padded_vocab, std::int64_t seq_len) {
  ModelConfig m;
  m.n_layer = c.n_layer;
  m.n_head = c.n_head;
  m.d_model = c.n_embd;
  m.vocab_size = c.vocab_size;
  m.padded_vocab_size = padded_vocab;
  m.seq_len = seq_len;
  m.max_seq_len = c.n_positions;
  return resolve_model_shape(m);
}

void read_hf_params(const std::string& dir, const ParamCatalog& cat, std::vector<float>& canonical) {
  const HfGpt2Config c = read_hf_config(dir);
  const ModelShape& s = cat.shape();
  const std::pair<const char*, std::pair<std::int64_t, std::int64_t>> fields[] = {
      {"n_layer", {c.n_layer, s.n_layer}},       {"n_head", {c.n_head, s.n_head}},
      {"n_embd", {c.n_embd, s.d_model}},         {"vocab_size", {c.vocab_size, s.vocab_size}},
      {"n_positions", {c.n_positions, s.max_seq_len}}};
  for (const auto& [key, v] : fields)
    if (v.first != v.second)  // the deck was completed from this file (app/model_init)
      bad(config_path(dir), std::string(key) + " = " + std::to_string(v.first) +
                                " but the model being built has " + std::to_string(v.second));
  const SafetensorsReader file(weights_path(dir));
  const std::string& path = file.path();
  // Either every name carries the prefix (GPT2LMHeadModel) or none does (GPT2Model).
  const bool prefixed = file.tensors().count("transformer.wte.weight") > 0;
  const std::string prefix = prefixed ? "transformer." : "";
  canonical.assign(static_cast<std::size_t>(cat.total_numel()), 0.0f);  // padded rows: zero
  std::set<std::string> used;
  std::vector<float> values;
  for (const HfTensor& h : hf_tensors(cat)) {
    const std::string name = prefix + h.name;
    const auto it = file.tensors().find(name);
    if (it == file.tensors().end()) bad(path, "tensor '" + name + "' is missing");
    if (it->second.shape != h.shape)
      bad(path, "tensor '" + name + "' has shape " + shape_text(it->second.shape) +
                    " but GPT-2 of this config needs " + shape_text(h.shape));
    file.read_f32(it->second, values);
    float* out = canonical.data() + h.offset;
    for (std::int64_t r = 0; r < h.rows; ++r)
      for (std::int64_t k = 0; k < h.cols; ++k)
        out[r * h.cols + k] = values[h.transposed ? k * h.rows + r : r * h.cols + k];
    used.insert(name);
  }
  for (const auto& [name, t] : file.tensors()) {
    if (used.count(name)) continue;
    const std::string bare = name.substr(name.rfind("transformer.", 0) == 0 ? 12 : 0);
    const bool mask_buffer = bare.rfind("h.", 0) == 0 &&
                             (bare.ends_with(".attn.bias") || bare.ends_with(".attn.masked_bias"));
    if (mask_buffer) continue;  // older transformers saved the causal mask; pdtrain has its own
    if (name == "lm_head.weight") {
      const StTensor& wte = file.tensors().at(prefix + "wte.weight");
      std::vector<float> head, table;
      if (t.shape == wte.shape) file.read_f32(t, head), file.read_f32(wte, table);
      if (head != table)
        bad(path, "tensor 'lm_head.weight' differs from '" + prefix +
                      "wte.weight': pdtrain's head is tied to the embedding");
      continue;
    }
    bad(path, "tensor '" + name + "' is not a GPT-2 tensor pdtrain knows");
  }
}

void write_hf(const std::string& dir, const ParamCatalog& cat, const float* canonical) {
  const ModelShape& s = cat.shape();
  create_output_directory(dir);
  std::vector<StOutTensor> tensors;
  for (const HfTensor& h : hf_tensors(cat)) {
    StOutTensor t{"transformer." + h.name, h.shape, {}};
    t.values.resize(static_cast<std::size_t>(h.rows * h.cols));
    const float* in = canonical + h.offset;
    for (std::int64_t r = 0; r < h.rows; ++r)
      for (std::int64_t k = 0; k < h.cols; ++k)
        t.values[h.transposed ? k * h.rows + r : r * h.cols + k] = in[r * h.cols + k];
    tensors.push_back(std::move(t));
  }
  write_safetensors(weights_path(dir), tensors, {{"format", "pt"}});
  // GPT2Config's names; dropout 0 because pdtrain trains without it (eval() ignores it anyway).
  nlohmann::ordered_json c = {{"architectures", {"GPT2LMHeadModel"}},
                              {"model_type", "gpt2"},
                              {"vocab_size", s.vocab_size},
                              {"n_positions", s.max_seq_len},
                              {"n_embd", s.d_model},
                              {"n_layer", s.n_layer},
                              {"n_head", s.n_head},
                              {"n_inner", nullptr},
                              {"activation_function", "gelu_new"},
                              {"layer_norm_epsilon", 1e-5},
                              {"resid_pdrop", 0.0},
                              {"embd_pdrop", 0.0},
                              {"attn_pdrop", 0.0},
                              {"initializer_range", 0.02},
                              {"scale_attn_weights", true},
                              {"tie_word_embeddings", true},
                              {"torch_dtype", "float32"}};
  // GPT-2's own vocabulary ends with <|endoftext|>; other vocabularies have no such token.
  const json eos = s.vocab_size == 50257 ? json(50256) : json(nullptr);
  c["bos_token_id"] = eos;
  c["eos_token_id"] = eos;
  write_file_atomically(config_path(dir), c.dump(2) + "\n");
}

}  // namespace pdtrain
