#pragma once
// The deck schema: one table that names every key with its type, range, documentation and
// where it lives in the Deck struct. Parsing, --set, the resolved deck and docs/deck.md are all
// driven by this table, so a key added here is automatically parsed, checked and documented.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "pdtrain/deck/deck.hpp"

namespace pdtrain::deck {

enum class KeyType { integer, floating, boolean, string, choice };

// Limits on a deck as text, checked before toml11 sees it: its size (read in full into
// memory; an endless stream such as /dev/zero must end in an error, not std::bad_alloc) and
// how deep arrays and inline tables nest (toml11 parses them by recursion).
inline constexpr std::size_t kMaxDeckBytes = std::size_t{1} << 20;
inline constexpr int kMaxDeckNesting = 64;
// A checkpoint keeps the resolved deck in one HDF5 attribute of the root group, an object
// header message, which HDF5 caps at 64 KiB; the rest of the header holds a few small
// attributes besides. A deck whose resolved form is longer (a megabyte-long run.name) is
// refused when it is read, not at the first checkpoint.
inline constexpr std::size_t kMaxResolvedDeckBytes = 60000;

// A typed key value; the alternative always matches the key's type (choice keys hold strings).
using Value = std::variant<std::int64_t, double, bool, std::string>;

// One end of a numeric range. `open` makes the bound exclusive (> rather than >=).
struct Bound {
  double value;
  bool open;
};

struct KeySpec {
  std::string key;      // dotted: "model.n_layer"
  std::string section;  // "model"
  std::string name;     // "n_layer"
  KeyType type = KeyType::integer;
  std::optional<Bound> min, max;     // integer and floating keys only
  std::vector<std::string> choices;  // choice keys only
  bool non_empty = false;            // string keys that may not be ""
  std::string rule;                  // cross-key rule, for the docs (checked in parse.cpp)
  std::string doc;
  std::function<Value(const Deck&)> get;
  std::function<void(Deck&, const Value&)> set;

  // Builders so the table in schema.cpp reads like the documentation.
  KeySpec& at_least(double v) { min = Bound{v, false}; return *this; }
  KeySpec& above(double v) { min = Bound{v, true}; return *this; }
  KeySpec& at_most(double v) { max = Bound{v, false}; return *this; }
  KeySpec& below(double v) { max = Bound{v, true}; return *this; }
  KeySpec& one_of(std::vector<std::string> c) {
    type = KeyType::choice;
    choices = std::move(c);
    return *this;
  }
  KeySpec& required() { non_empty = true; return *this; }
  KeySpec& with_rule(std::string r) { rule = std::move(r); return *this; }
};

struct SectionSpec {
  std::string name;
  std::string doc;
};

// Every key, in section order and then in the order of the Deck structs.
const std::vector<KeySpec>& schema();
// Every section, in order.
const std::vector<SectionSpec>& sections();

const KeySpec* find_key(std::string_view dotted);
bool is_section(std::string_view name);

// The value a key takes when no deck and no --set names it (the Deck struct defaults).
Value default_value(const KeySpec& spec);

// "" when `v` is acceptable for the key on its own, else e.g. "must be > 0, got -0.001".
std::string check_value(const KeySpec& spec, const Value& v);

// TOML literal of a value: strings quoted and escaped, floats always with '.' or exponent and
// printed so they read back to the same double.
std::string toml_literal(const Value& v);
// What a key expects, for "expected X" messages: "an integer", "a number", ...
std::string type_phrase(KeyType t);
// "[0, 1)", ">= 1", "> 0", or "" when unbounded.
std::string range_text(const KeySpec& spec);

// Nearest valid key to a mistyped dotted (or bare) key, if one is reasonably close.
std::optional<std::string> suggest_key(std::string_view typed);
// Nearest valid section name, if one is reasonably close.
std::optional<std::string> suggest_section(std::string_view typed);
// Optimal-string-alignment edit distance (adjacent swaps cost 1), case-insensitive.
std::size_t edit_distance(std::string_view a, std::string_view b);

}  // namespace pdtrain::deck
