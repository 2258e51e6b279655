// Reading a deck: TOML text -> checked Deck, then --set overrides, then the rules that tie
// keys together. Every problem is one Error(ExitCode::deck) that names the file and line (or
// the --set) that must change.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <tuple>
#include <toml.hpp>

#include "pdtrain/core/error.hpp"
#include "pdtrain/deck/deck.hpp"
#include "pdtrain/deck/schema.hpp"
#include "pdtrain/deck/toml_input.hpp"

namespace pdtrain {

extern const char* const kDefaultDeckText;  // generated from input/default.toml

namespace {

using deck::KeySpec;
using deck::KeyType;
using deck::Value;

[[noreturn]] void fail(const std::string& msg) { throw Error(ExitCode::deck, msg); }

std::string at(const std::string& file, std::uint_least32_t line) {
  return line ? file + ":" + std::to_string(line) : file;
}

std::string trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string_view::npos) return "";
  const auto last = s.find_last_not_of(" \t");
  return std::string(s.substr(first, last - first + 1));
}

std::string did_you_mean(const std::optional<std::string>& s, const char* open = "'",
                         const char* close = "'") {
  return s ? std::string("; did you mean ") + open + *s + close + "?" : "";
}

// ---------------------------------------------------------------------------------------------
// TOML text -> toml::value

// toml11 says "[error] toml::parse_xxx: what" followed by a source snippet; lead with
// FILE:LINE like every other deck message, keep the snippet, drop the internal function name.
std::string syntax_message(const std::string& file, const toml::exception& e) {
  std::istringstream lines(e.what());
  std::string first;
  std::getline(lines, first);
  if (first.rfind("[error] ", 0) == 0) first.erase(0, 8);
  const auto colon = first.find(": ");
  if (colon != std::string::npos && first.find(' ') > colon) first.erase(0, colon + 2);
  std::string snippet, line;
  while (std::getline(lines, line))
    if (line.rfind(" --> ", 0) != 0) snippet += "\n" + line;
  return at(file, e.location().line()) + ": TOML syntax error: " + first + snippet;
}

// The deepest nesting of arrays and inline tables in `text` (brackets outside strings and
// comments). toml11 parses nested values by recursion, so a deck nested a few thousand deep
// would overflow the stack; this scan runs first and never recurses. Table headers ([a],
// [[a]]) count as one or two levels, which only makes the bound a little stricter.
struct Nesting {
  int depth = 0;
  std::uint_least32_t line = 1;  // where `depth` was first reached
};

Nesting deepest_nesting(std::string_view text) {
  Nesting deepest;
  int depth = 0;
  std::uint_least32_t line = 1;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
    } else if (c == '#') {
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
    } else if (c == '"' || c == '\'') {
      const bool multi = text.substr(i, 3) == std::string(3, c);
      const std::string close(multi ? 3 : 1, c);
      for (i += close.size(); i < text.size() && text.substr(i, close.size()) != close; ++i) {
        if (text[i] == '\n') ++line;
        if (c == '"' && text[i] == '\\') ++i;  // an escape: the next character is literal
      }
      i += close.size() - 1;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest.depth) deepest = {depth, line};
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

// "a string (\"six\")" for "expected X, got Y" messages.
std::string describe(const toml::value& v) {
  switch (v.type()) {
    case toml::value_t::integer: return "an integer (" + std::to_string(v.as_integer()) + ")";
    case toml::value_t::floating:
      return "a float (" + deck::toml_literal(Value{v.as_floating()}) + ")";
    case toml::value_t::boolean: return v.as_boolean() ? "a boolean (true)" : "a boolean (false)";
    case toml::value_t::string:
      return "a string (" + deck::toml_literal(Value{v.as_string().str}) + ")";
    case toml::value_t::array: return "an array";
    case toml::value_t::table: return "a table";
    case toml::value_t::empty: return "nothing";
    default: return "a date/time";
  }
}

// The key's typed value, or nullopt when the TOML type does not fit. Integers are accepted
// for floats ("lr = 1"), never the other way round: a fractional layer count is a mistake.
std::optional<Value> convert(const KeySpec& spec, const toml::value& v) {
  switch (spec.type) {
    case KeyType::integer:
      if (v.is_integer()) return Value{std::int64_t{v.as_integer()}};
      break;
    case KeyType::floating:
      if (v.is_floating()) return Value{v.as_floating()};
      if (v.is_integer()) return Value{static_cast<double>(v.as_integer())};
      break;
    case KeyType::boolean:
      if (v.is_boolean()) return Value{v.as_boolean()};
      break;
    case KeyType::string:
    case KeyType::choice:
      if (v.is_string()) return Value{v.as_string().str};
      break;
  }
  return std::nullopt;
}

void store(Deck& deck, const KeySpec& spec, const Value& v, const std::string& context,
           const std::string& origin) {
  if (const auto why = deck::check_value(spec, v); !why.empty()) fail(context + ": " + why);
  spec.set(deck, v);
  deck.origin[spec.key] = origin;
}

// ---------------------------------------------------------------------------------------------
// The deck file

// One thing found in the file: a key of a known section, or a top-level item (name empty)
// that is either an unknown section, a stray key, or a known section that is not a table.
struct Entry {
  std::uint_least32_t line;
  std::string section;
  std::string name;
  const toml::value* value;
};

// toml11 keeps tables in hash order; sorting by line makes the first error reported the
// first one in the file, the same on every run.
std::vector<Entry> entries_by_line(const toml::value& root) {
  std::vector<Entry> out;
  for (const auto& [section, v] : root.as_table()) {
    if (section == "sweep") continue;  // read by parse_sweep (sweep.cpp)
    if (!deck::is_section(section) || !v.is_table()) {
      out.push_back({v.location().line(), section, "", &v});
      continue;
    }
    for (const auto& [name, x] : v.as_table())
      out.push_back({x.location().line(), section, name, &x});
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.line, a.section, a.name) < std::tie(b.line, b.section, b.name);
  });
  return out;
}

[[noreturn]] void fail_top_level(const Entry& e, const std::string& loc) {
  if (deck::is_section(e.section))
    fail(loc + ": " + e.section + ": expected a table [" + e.section + "], got " +
         describe(*e.value));
  if (e.value->is_table())
    fail(loc + ": unknown section [" + e.section + "]" +
         did_you_mean(deck::suggest_section(e.section), "[", "]"));
  fail(loc + ": unknown key '" + e.section + "'" + did_you_mean(deck::suggest_key(e.section)));
}

void apply_entry(Deck& deck, const std::string& file, const Entry& e) {
  const std::string loc = at(file, e.line);
  if (e.name.empty()) fail_top_level(e, loc);
  const std::string dotted = e.section + "." + e.name;
  const KeySpec* spec = deck::find_key(dotted);
  if (!spec) fail(loc + ": unknown key '" + dotted + "'" + did_you_mean(deck::suggest_key(dotted)));
  const auto value = convert(*spec, *e.value);
  if (!value)
    fail(loc + ": " + dotted + ": expected " + deck::type_phrase(spec->type) + ", got " +
         describe(*e.value));
  store(deck, *spec, *value, loc + ": " + dotted, loc);
}

// ---------------------------------------------------------------------------------------------
// --set section.key=value

// Numbers and booleans are read with TOML's own grammar (1e-3, 1_000, 0x10), so a value means
// the same on the command line as in a deck. nullopt when `raw` is not one TOML value.
std::optional<toml::value> toml_scalar(const std::string& raw) {
  try {
    std::istringstream in("v = " + raw + "\n");
    const toml::value t = toml::parse(in, "--set");
    if (t.as_table().size() != 1 || !t.contains("v")) return std::nullopt;
    return t.at("v");
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// Forms a shell user types but TOML rejects (".5", "5."), read in full or not at all.
std::optional<Value> plain_double(const std::string& raw) {
  double d = 0;
  const auto res = std::from_chars(raw.data(), raw.data() + raw.size(), d);
  if (res.ec != std::errc() || res.ptr != raw.data() + raw.size()) return std::nullopt;
  return Value{d};
}

Value override_value(const KeySpec& spec, const std::string& raw, const std::string& context) {
  const bool text = spec.type == KeyType::string || spec.type == KeyType::choice;
  const bool quoted = !raw.empty() && (raw.front() == '"' || raw.front() == '\'');
  if (text && !quoted) return Value{raw};  // strings need no quotes on the command line
  const auto parsed = toml_scalar(raw);
  if (parsed)
    if (auto v = convert(spec, *parsed)) return *v;
  if (spec.type == KeyType::floating && !quoted)
    if (auto v = plain_double(raw)) return *v;
  std::string msg = context + ": expected " + deck::type_phrase(spec.type);
  if (parsed) msg += ", got " + describe(*parsed);
  fail(msg);
}

void apply_override(Deck& deck, const std::string& text) {
  const std::string context = "--set " + text;
  const auto eq = text.find('=');
  const std::string key = trim(std::string_view(text).substr(0, eq));
  if (eq == std::string::npos || key.empty()) fail(context + ": expected section.key=value");
  const KeySpec* spec = deck::find_key(key);
  if (!spec) fail(context + ": unknown key '" + key + "'" + did_you_mean(deck::suggest_key(key)));
  const Value v = override_value(*spec, trim(std::string_view(text).substr(eq + 1)), context);
  store(deck, *spec, v, context, "--set");
}

// ---------------------------------------------------------------------------------------------
// Rules between keys

std::string val(const Deck& d, const char* key) {
  return deck::toml_literal(deck::find_key(key)->get(d));
}

// A rule between two keys. The message names the key the user most likely has to change: the
// one set last (--set over the file over a default), the primary one on a tie. Each side has
// its own wording so the message reads "<key>: must ..., got <its value>".
struct CrossRule {
  const char* primary;
  const char* secondary;
  std::function<bool(const Deck&)> holds;
  std::function<std::string(const Deck&)> primary_says;
  std::function<std::string(const Deck&)> secondary_says;
};

// A model size that is 0 (derived from `floor`) or at least `floor`: padded_vocab_size over
// vocab_size, max_seq_len over seq_len.
CrossRule zero_or_at_least(const char* key, std::int64_t ModelConfig::*value, const char* floor,
                           std::int64_t ModelConfig::*floor_value) {
  return {key, floor,
          [=](const Deck& d) {
            return d.model.*value == 0 || d.model.*value >= d.model.*floor_value;
          },
          [=](const Deck& d) {
            return "must be 0 or >= " + std::string(floor) + " (" + val(d, floor) + "), got " +
                   val(d, key);
          },
          [=](const Deck& d) {
            return "must be <= " + std::string(key) + " (" + val(d, key) +
                   ") when that is not 0, got " + val(d, floor);
          }};
}

const std::vector<CrossRule>& cross_rules() {
  static const std::vector<CrossRule> rules = {
      {"model.d_model", "model.n_head",
       [](const Deck& d) { return d.model.d_model % d.model.n_head == 0; },
       [](const Deck& d) {
         return "must be divisible by model.n_head (" + val(d, "model.n_head") + "), got " +
                val(d, "model.d_model");
       },
       [](const Deck& d) {
         return "must divide model.d_model (" + val(d, "model.d_model") + "), got " +
                val(d, "model.n_head");
       }},
      zero_or_at_least("model.padded_vocab_size", &ModelConfig::padded_vocab_size,
                       "model.vocab_size", &ModelConfig::vocab_size),
      zero_or_at_least("model.max_seq_len", &ModelConfig::max_seq_len, "model.seq_len",
                       &ModelConfig::seq_len),
      // Only the synthetic source copies tokens; a text run need not care about copy_lag.
      {"data.copy_lag", "model.seq_len",
       [](const Deck& d) {
         return d.data.source != "synthetic" || d.data.copy_lag < d.model.seq_len;
       },
       [](const Deck& d) {
         return "must be < model.seq_len (" + val(d, "model.seq_len") + "), got " +
                val(d, "data.copy_lag");
       },
       [](const Deck& d) {
         return "must be > data.copy_lag (" + val(d, "data.copy_lag") +
                ") for the synthetic source, got " + val(d, "model.seq_len");
       }},
      {"data.path", "data.source",
       [](const Deck& d) { return d.data.source == "synthetic" || !d.data.path.empty(); },
       [](const Deck& d) {
         return "must be set when data.source is " + val(d, "data.source");
       },
       [](const Deck& d) {
         return "needs data.path (the file to read), got " + val(d, "data.source");
       }},
      {"model.init", "model.init",
       [](const Deck& d) {
         const std::string& i = d.model.init;
         return i.empty() || (i.rfind("llmc:", 0) == 0 && i.size() > 5) ||
                (i.rfind("hf:", 0) == 0 && i.size() > 3);
       },
       [](const Deck& d) {
         return "must be empty (random), llmc:PATH or hf:DIR, got " + val(d, "model.init");
       },
       [](const Deck& d) {
         return "must be empty, llmc:PATH or hf:DIR, got " + val(d, "model.init");
       }},
      // bf16 precision puts bf16 weights on the wire; lz4 would recompress float bytes.
      {"pd.fetch_codec", "train.precision",
       [](const Deck& d) { return d.train.precision != Precision::bf16 || d.pd.fetch_codec != "lz4"; },
       [](const Deck& d) {
         return "must be raw or bf16 when train.precision is bf16 (holders then serve bf16 "
                "copies), got " + val(d, "pd.fetch_codec");
       },
       [](const Deck& d) {
         return "bf16 serves bf16 weights, which pd.fetch_codec = " + val(d, "pd.fetch_codec") +
                " cannot carry; got " + val(d, "train.precision");
       }},
      // Second moments need a code for zero besides their levels.
      {"checkpoint.moment_bits", "checkpoint.moment_bits",
       [](const Deck& d) { return d.checkpoint.moment_bits != 1; },
       [](const Deck& d) {
         return "must be 0 (lossless) or 2..8, got " + val(d, "checkpoint.moment_bits");
       },
       [](const Deck& d) {
         return "must be 0 (lossless) or 2..8, got " + val(d, "checkpoint.moment_bits");
       }},
      {"optimizer.min_lr", "optimizer.lr",
       [](const Deck& d) { return d.optimizer.min_lr <= d.optimizer.lr; },
       [](const Deck& d) {
         return "must be <= optimizer.lr (" + val(d, "optimizer.lr") + "), got " +
                val(d, "optimizer.min_lr");
       },
       [](const Deck& d) {
         return "must be >= optimizer.min_lr (" + val(d, "optimizer.min_lr") + "), got " +
                val(d, "optimizer.lr");
       }},
  };
  return rules;
}

int setting_rank(const Deck& d, const std::string& key) {
  const auto it = d.origin.find(key);
  if (it == d.origin.end() || it->second == "default") return 0;
  return it->second == "--set" ? 2 : 1;
}

void check_cross_rules(const Deck& d) {
  for (const auto& r : cross_rules()) {
    if (r.holds(d)) continue;
    const bool blame_secondary = setting_rank(d, r.secondary) > setting_rank(d, r.primary);
    if (blame_secondary) fail(d.where(r.secondary) + ": " + r.secondary_says(d));
    fail(d.where(r.primary) + ": " + r.primary_says(d));
  }
}

// The resolved deck must fit where a checkpoint keeps it (deck::kMaxResolvedDeckBytes); only
// string values can make it long, so the message names the longest one the user set (a
// default out_dir merely repeats run.name).
void check_resolved_size(const Deck& d) {
  const std::size_t size = d.resolved_toml().size();
  if (size <= deck::kMaxResolvedDeckBytes) return;
  const KeySpec* longest = nullptr;
  std::size_t longest_size = 0;
  for (const auto& k : deck::schema()) {
    const Value v = k.get(d);
    const auto* s = std::get_if<std::string>(&v);
    if (s && setting_rank(d, k.key) > 0 && s->size() >= longest_size)
      longest = &k, longest_size = s->size();
  }
  if (!longest) fail(d.source_name + ": the resolved deck is " + std::to_string(size) + " bytes, more than the " + std::to_string(deck::kMaxResolvedDeckBytes) + " a checkpoint can store");
  fail(d.where(longest->key) + ": its value is " + std::to_string(longest_size) +
       " bytes long, which makes the resolved deck " + std::to_string(size) +
       " bytes; a checkpoint stores it in one HDF5 attribute of at most " +
       std::to_string(deck::kMaxResolvedDeckBytes) + " bytes");
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

void check_deck_rules(const Deck& deck) { check_cross_rules(deck); }

namespace deck {

toml::value parse_toml(const std::string& text, const std::string& file, const char* kind) {
  if (const Nesting n = deepest_nesting(text); n.depth > deck::kMaxDeckNesting)
    fail(at(file, n.line) + ": values nested " + std::to_string(n.depth) +
         " deep (arrays and inline tables); a " + std::string(kind) + " may nest at most " +
         std::to_string(deck::kMaxDeckNesting));
  std::istringstream in(text);
  try {
    return toml::parse(in, file);
  } catch (const toml::exception& e) {
    fail(syntax_message(file, e));
  } catch (const std::exception& e) {
    fail(file + ": cannot parse " + kind + ": " + e.what());
  }
}

std::string read_toml_text(const std::string& path, const char* kind) {
  errno = 0;
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (!f) fail(std::string("cannot read ") + kind + " file '" + path + "': " + std::strerror(errno));
  std::string text;
  char buf[1 << 16];
  std::size_t n = 0;
  // Bounded: a file that is an endless stream (/dev/zero, a pipe) must not exhaust memory.
  while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0) {
    text.append(buf, n);
    if (text.size() > deck::kMaxDeckBytes)
      fail(std::string(kind) + " file '" + path + "' is larger than " +
           std::to_string(deck::kMaxDeckBytes) + " bytes (the most a " + kind +
           " file may be); is it the right file?");
  }
  // A directory opens fine on Linux and fails here with EISDIR.
  if (std::ferror(f.get())) fail(std::string("cannot read ") + kind + " file '" + path + "': " + std::strerror(errno));
  return text;
}

}  // namespace deck

Deck parse_deck(const std::string& text, const std::string& source_name,
                const std::vector<std::string>& overrides) {
  Deck deck;
  deck.source_name = source_name;
  deck.source_text = text;
  for (const auto& spec : deck::schema()) deck.origin[spec.key] = "default";
  const toml::value root = deck::parse_toml(text, source_name, "deck");
  for (const auto& e : entries_by_line(root)) apply_entry(deck, source_name, e);
  for (const auto& o : overrides) apply_override(deck, o);
  check_cross_rules(deck);
  if (deck.run.out_dir.empty()) deck.run.out_dir = "runs/" + deck.run.name;
  if (deck.checkpoint.dir.empty()) deck.checkpoint.dir = deck.run.out_dir + "/checkpoints";
  check_resolved_size(deck);
  return deck;
}

Deck load_deck(const std::string& path, const std::vector<std::string>& overrides) {
  return parse_deck(read_deck_text(path), path, overrides);
}

std::string read_deck_text(const std::string& path) { return deck::read_toml_text(path, "deck"); }

const char* default_deck_text() { return kDefaultDeckText; }

}  // namespace pdtrain
