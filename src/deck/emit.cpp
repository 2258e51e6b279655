// Writing a Deck back out: origins for messages, the resolved deck as TOML, and the Markdown
// key reference. All three walk the schema, so they cover every key by construction.
#include <algorithm>
#include <sstream>

#include "pdtrain/deck/deck.hpp"
#include "pdtrain/deck/schema.hpp"

namespace pdtrain {
namespace {

// Comments are one line each; a source name with a newline must not end one early.
std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\r', ' ');
  return s;
}

std::string pad(std::string s, std::size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

std::string md_escape(std::string_view s) {
  std::string out;
  for (const char c : s) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

std::string md_type(const deck::KeySpec& k) {
  switch (k.type) {
    case deck::KeyType::integer: return "integer";
    case deck::KeyType::floating: return "float";
    case deck::KeyType::boolean: return "boolean";
    case deck::KeyType::string: return "string";
    case deck::KeyType::choice: {
      std::string s = "one of";
      for (std::size_t i = 0; i < k.choices.size(); ++i)
        s += (i ? ", `" : " `") + k.choices[i] + "`";
      return s;
    }
  }
  return "";
}

std::string md_range(const deck::KeySpec& k) {
  std::vector<std::string> parts;
  if (const auto r = deck::range_text(k); !r.empty()) parts.push_back(r);
  if (k.non_empty) parts.push_back("non-empty");
  if (!k.rule.empty()) parts.push_back(k.rule);
  if (parts.empty()) return "any";
  std::string s;
  for (const auto& p : parts) s += (s.empty() ? "" : "; ") + p;
  return s;
}

}  // namespace

bool same_settings(const Deck& a, const Deck& b) {
  return a.run == b.run && a.model == b.model && a.data == b.data && a.parallel == b.parallel &&
         a.train == b.train && a.compute == b.compute && a.optimizer == b.optimizer && a.pd == b.pd && a.checkpoint == b.checkpoint && a.output == b.output;
}

std::string Deck::where(const std::string& dotted_key) const {
  const auto it = origin.find(dotted_key);
  if (it == origin.end() || it->second == "default") return "default value of " + dotted_key;
  if (it->second == "--set") return "--set " + dotted_key;
  return it->second + ": " + dotted_key;
}

std::string Deck::resolved_toml() const {
  std::ostringstream out;
  out << "# Resolved pdtrain deck: every key with its final value.\n"
      << "# Read from " << one_line(source_name) << ", then --set overrides, then defaults;\n"
      << "# the comment on each key says which. Running with this file repeats the run.\n";
  std::string section;
  for (const auto& k : deck::schema()) {
    if (k.section != section) {
      section = k.section;
      out << "\n[" << section << "]\n";
    }
    const auto it = origin.find(k.key);
    const std::string from = it == origin.end() ? "default" : one_line(it->second);
    out << pad(k.name + " = " + deck::toml_literal(k.get(*this)), 30) << "  # " << from << "\n";
  }
  return out.str();
}

std::string deck_reference_markdown() {
  std::ostringstream out;
  out << "## Key reference\n";
  for (const auto& s : deck::sections()) {
    out << "\n### [" << s.name << "]\n\n" << s.doc << "\n\n"
        << "| key | type | default | range | meaning |\n"
        << "|-----|------|---------|-------|---------|\n";
    for (const auto& k : deck::schema()) {
      if (k.section != s.name) continue;
      out << "| `" << k.key << "` | " << md_type(k) << " | `"
          << md_escape(deck::toml_literal(deck::default_value(k))) << "` | "
          << md_escape(md_range(k)) << " | " << md_escape(k.doc) << " |\n";
    }
  }
  return out.str();
}

}  // namespace pdtrain
