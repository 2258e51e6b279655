#include "pdtrain/deck/sweep.hpp"

#include <algorithm>
#include <sstream>
#include <toml.hpp>

#include "pdtrain/core/error.hpp"
#include "pdtrain/deck/schema.hpp"

namespace pdtrain {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw Error(ExitCode::deck, msg); }

std::string at(const std::string& file, const toml::value& v) {
  return file + ":" + std::to_string(v.location().line());
}

// [sweep] entries flattened to dotted names: `optimizer.lr = [...]` (a TOML dotted key, which
// makes a nested table) and `"optimizer.lr" = [...]` both give "optimizer.lr".
void flatten(const toml::value& table, const std::string& prefix,
             std::vector<std::pair<std::string, const toml::value*>>& out) {
  for (const auto& [k, v] : table.as_table()) {
    const std::string name = prefix.empty() ? k : prefix + "." + k;
    if (v.is_table())
      flatten(v, name, out);
    else
      out.emplace_back(name, &v);
  }
}

// A sweep value as the TOML literal --set takes, checked against the key's schema.
std::string literal_of(const deck::KeySpec& spec, const toml::value& v, const std::string& where) {
  std::optional<deck::Value> typed;
  switch (spec.type) {
    case deck::KeyType::integer:
      if (v.is_integer()) typed = deck::Value{std::int64_t{v.as_integer()}};
      break;
    case deck::KeyType::floating:
      if (v.is_floating()) typed = deck::Value{v.as_floating()};
      if (v.is_integer()) typed = deck::Value{static_cast<double>(v.as_integer())};
      break;
    case deck::KeyType::boolean:
      if (v.is_boolean()) typed = deck::Value{v.as_boolean()};
      break;
    default:
      if (v.is_string()) typed = deck::Value{v.as_string().str};
  }
  if (!typed) fail(where + ": sweep value for " + spec.key + ": expected " + deck::type_phrase(spec.type));
  if (const auto why = deck::check_value(spec, *typed); !why.empty())
    fail(where + ": sweep value for " + spec.key + ": " + why);
  return deck::toml_literal(*typed);
}

}  // namespace

std::size_t Sweep::points() const {
  if (keys.empty()) return 0;
  if (zip) return values.front().size();
  std::size_t n = 1;
  for (const auto& v : values) n *= v.size();
  return n;
}

std::vector<SweepSetting> Sweep::point(std::size_t n) const {
  std::vector<SweepSetting> out(keys.size());
  for (std::size_t i = keys.size(); i-- > 0;) {  // last key fastest
    const std::size_t len = values[i].size();
    const std::size_t j = zip ? n : n % len;
    out[i] = {keys[i], values[i][j]};
    if (!zip) n /= len;
  }
  return out;
}

std::string Sweep::label(std::size_t n) const {
  std::string s;
  for (const SweepSetting& p : point(n)) {
    std::string v = p.value;
    v.erase(std::remove(v.begin(), v.end(), '"'), v.end());
    std::replace(v.begin(), v.end(), '/', '_');
    s += (s.empty() ? "" : ",") + p.key.substr(p.key.find('.') + 1) + "=" + v;
  }
  return s;
}

Sweep parse_sweep(const std::string& text, const std::string& source_name) {
  Sweep sweep;
  std::istringstream in(text);
  const toml::value root = toml::parse(in, source_name);  // parse_deck has checked the syntax
  if (!root.contains("sweep")) return sweep;
  const toml::value& table = root.at("sweep");
  if (!table.is_table()) fail(at(source_name, table) + ": sweep: expected a table [sweep]");
  std::vector<std::pair<std::string, const toml::value*>> entries;
  flatten(table, "", entries);
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return a.second->location().line() < b.second->location().line();
  });
  for (const auto& [name, v] : entries) {
    const std::string where = at(source_name, *v);
    if (name == "mode") {
      if (!v->is_string() || (v->as_string().str != "product" && v->as_string().str != "zip"))
        fail(where + ": sweep.mode: must be \"product\" or \"zip\"");
      sweep.zip = v->as_string().str == "zip";
      continue;
    }
    const deck::KeySpec* spec = deck::find_key(name);
    if (!spec) {
      const auto s = deck::suggest_key(name);
      fail(where + ": unknown key '" + name + "' in [sweep]" +
           (s ? "; did you mean '" + *s + "'?" : ""));
    }
    if (!v->is_array()) fail(where + ": sweep." + name + ": expected a list of values");
    if (v->as_array().empty()) fail(where + ": sweep." + name + ": empty list (no points)");
    std::vector<std::string> values;
    for (const toml::value& x : v->as_array()) values.push_back(literal_of(*spec, x, where));
    sweep.keys.push_back(name);
    sweep.values.push_back(std::move(values));
  }
  if (sweep.zip)
    for (std::size_t i = 1; i < sweep.keys.size(); ++i)
      if (sweep.values[i].size() != sweep.values[0].size()) {
        const auto& e = *std::find_if(entries.begin(), entries.end(),
                                      [&](const auto& p) { return p.first == sweep.keys[i]; });
        fail(at(source_name, *e.second) + ": sweep." + sweep.keys[i] + " has " +
             std::to_string(sweep.values[i].size()) + " values but sweep." + sweep.keys[0] +
             " has " + std::to_string(sweep.values[0].size()) +
             " (mode = \"zip\" takes the lists element by element)");
      }
  if (sweep.keys.empty()) fail(at(source_name, table) + ": [sweep] lists no key to vary");
  return sweep;
}

Deck sweep_point_deck(const std::string& text, const std::string& source_name,
                      const std::vector<std::string>& overrides, const Sweep& sweep,
                      std::size_t n) {
  if (n >= sweep.points())
    fail("--sweep-index " + std::to_string(n) + ": the sweep in " + source_name + " has " +
         std::to_string(sweep.points()) + " points (0.." + std::to_string(sweep.points() - 1) + ")");
  std::vector<std::string> sets = overrides;
  for (const SweepSetting& s : sweep.point(n)) sets.push_back(s.key + "=" + s.value);
  Deck base = parse_deck(text, source_name, overrides);  // out_dir of the sweep as a whole
  Deck d = parse_deck(text, source_name, sets);
  for (const SweepSetting& s : sweep.point(n)) d.origin[s.key] = "sweep point " + std::to_string(n);
  const std::string own_dir = d.run.out_dir + "/checkpoints";
  d.run.out_dir = base.run.out_dir + "/" + std::to_string(n) + "-" + sweep.label(n);
  if (d.checkpoint.dir == own_dir) d.checkpoint.dir = d.run.out_dir + "/checkpoints";
  return d;
}

}  // namespace pdtrain
