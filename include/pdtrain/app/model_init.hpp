#pragma once
// model.init: the file a run starts from (llm.c's format or a Hugging Face GPT-2 directory).
// The file is the model: its shape completes the deck before anything is built from it.
#include <string>
#include <vector>

#include "pdtrain/deck/deck.hpp"
#include "pdtrain/model/catalog.hpp"

namespace pdtrain {

struct InitFile {
  enum class Kind { none, llmc, hf } kind = Kind::none;
  std::string path;  // the llm.c file or the Hugging Face directory
};
InitFile init_file(const Deck& d);

// The deck with the model's shape taken from model.init's file: each model key the deck leaves
// at its default (or 0, "from the file") takes the file's value, and model.seq_len, when left
// at its default, is cut to the file's positions. A key the deck sets to another value is
// Error(data) naming the deck's line and the file's field: "t.toml:3: model.n_layer = 3 in the
// deck but num_layers = 2 in FILE". Without model.init the deck is returned unchanged.
Deck with_model_of_init(const Deck& deck);

// The init file's parameters in the catalogue's canonical order (cat.total_numel() floats).
void read_init_params(const InitFile& init, const ParamCatalog& cat, std::vector<float>& canonical);

}  // namespace pdtrain
