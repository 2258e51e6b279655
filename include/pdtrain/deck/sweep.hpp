#pragma once
// Parameter sweeps: a deck's [sweep] table maps deck keys to lists of values. Its points are
// the Cartesian product of the lists (first key slowest), or, with mode = "zip", the lists
// taken element by element. Point N runs in its own directory named after it, e.g.
// runs/<name>/3-lr=0.001,n_layer=6, so a Slurm job array runs one point per task.
#include <string>
#include <vector>

#include "pdtrain/deck/deck.hpp"

namespace pdtrain {

struct SweepSetting {
  std::string key;    // dotted deck key
  std::string value;  // TOML literal, as --set would take it
};

struct Sweep {
  bool zip = false;
  std::vector<std::string> keys;                 // in file order
  std::vector<std::vector<std::string>> values;  // per key, TOML literals
  std::size_t points() const;
  std::vector<SweepSetting> point(std::size_t n) const;
  // "lr=0.001,n_layer=6": short names, for directory names and listings.
  std::string label(std::size_t n) const;
};

// Reads the [sweep] table of a deck text (empty Sweep when it has none). Unknown keys, empty
// lists, values of the wrong type or range and zip lists of unequal length are deck errors
// naming the file and line.
Sweep parse_sweep(const std::string& text, const std::string& source_name);

// The deck of point n: the deck with the point's settings applied as --set overrides (after
// the user's own), run.out_dir = <out_dir>/<n>-<label>.
Deck sweep_point_deck(const std::string& text, const std::string& source_name,
                      const std::vector<std::string>& overrides, const Sweep& sweep,
                      std::size_t n);

}  // namespace pdtrain
