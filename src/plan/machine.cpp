// Machine files: TOML -> checked Machine. One table of keys drives reading, checking and
// writing, so the three cannot drift apart.
#include "pdtrain/plan/machine.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>

#include "pdtrain/core/error.hpp"
#include "pdtrain/deck/toml_input.hpp"

namespace pdtrain::plan {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw Error(ExitCode::deck, msg); }

std::string at(const std::string& file, const toml::value& v) {
  const auto line = v.location().line();
  return line ? file + ":" + std::to_string(line) : file;
}

// A number key: stored as `scale` x the file's value (GiB, GB/s, TFLOP/s, us -> SI units).
struct NumberKey {
  const char* section;
  const char* name;
  const char* unit;  // the file's unit, for messages and docs
  double scale;
  bool required;
  std::function<double&(Machine&)> field;
};

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0, kGB = 1e9, kTera = 1e12, kMicro = 1e-6;

const std::vector<NumberKey>& number_keys() {
  static const std::vector<NumberKey> keys = {
      {"device", "memory_gib", "GiB", kGiB, true,
       [](Machine& m) -> double& { return m.device.memory_bytes; }},
      {"device", "memory_bandwidth_gbs", "GB/s", kGB, true,
       [](Machine& m) -> double& { return m.device.memory_bandwidth; }},
      {"device", "peak_tflops_fp32", "TFLOP/s", kTera, true,
       [](Machine& m) -> double& { return m.device.peak_fp32; }},
      {"device", "peak_tflops_bf16", "TFLOP/s", kTera, true,
       [](Machine& m) -> double& { return m.device.peak_bf16; }},
      {"device", "elementwise_gbs", "GB/s", kGB, false,
       [](Machine& m) -> double& { return m.device.elementwise_rate; }},
      {"device", "kernel_overhead_us", "us", kMicro, false,
       [](Machine& m) -> double& { return m.device.kernel_overhead_s; }},
      {"device", "sm_count", "SMs", 1, false,
       [](Machine& m) -> double& { return m.device.sm_count; }},
      {"device", "sm_clock_mhz", "MHz", 1e6, false,
       [](Machine& m) -> double& { return m.device.sm_clock_hz; }},
      {"node", "cpu_memory_gib", "GiB", kGiB, true,
       [](Machine& m) -> double& { return m.node.cpu_memory_bytes; }},
      {"node", "cpu_memory_bandwidth_gbs", "GB/s", kGB, true,
       [](Machine& m) -> double& { return m.node.cpu_memory_bandwidth; }},
      {"node", "wait_core_share", "share of a core", 1, false,
       [](Machine& m) -> double& { return m.node.wait_core_share; }},
      {"link.intra", "latency_us", "us", kMicro, true,
       [](Machine& m) -> double& { return m.intra.latency_s; }},
      {"link.intra", "bandwidth_gbs", "GB/s", kGB, true,
       [](Machine& m) -> double& { return m.intra.bandwidth; }},
      {"link.inter", "latency_us", "us", kMicro, true,
       [](Machine& m) -> double& { return m.inter.latency_s; }},
      {"link.inter", "bandwidth_gbs", "GB/s", kGB, true,
       [](Machine& m) -> double& { return m.inter.bandwidth; }},
      {"link.host", "latency_us", "us", kMicro, false,
       [](Machine& m) -> double& { return m.host.latency_s; }},
      {"link.host", "bandwidth_gbs", "GB/s", kGB, false,
       [](Machine& m) -> double& { return m.host.bandwidth; }},
      {"holder", "adamw_mparams_per_core", "M parameters/s", 1e6, true,
       [](Machine& m) -> double& { return m.holder.adamw_params_per_core; }},
      {"holder", "crc_gbs_per_core", "GB/s", kGB, true,
       [](Machine& m) -> double& { return m.holder.crc_bytes_per_core; }},
  };
  return keys;
}

// Keys that are not plain numbers, read by hand below.
const std::vector<std::string>& other_keys() {
  static const std::vector<std::string> keys = {"machine.name", "machine.sources", "device.name",
                                                "device.kind", "device.gemm_efficiency", "device.attention",
                                                "node.devices", "node.cpu_cores"};
  return keys;
}

std::string describe(const toml::value& v) {
  std::ostringstream s;
  s << v;
  std::string t = s.str();
  if (t.size() > 40) t = t.substr(0, 37) + "...";
  return t;
}

const toml::value* lookup(const toml::value& root, const std::string& section,
                        const std::string& name) {
  const toml::value* t = &root;
  std::string rest = section;
  while (!rest.empty()) {  // "link.intra" -> root["link"]["intra"]
    const auto dot = rest.find('.');
    const std::string part = rest.substr(0, dot);
    if (!t->is_table() || !t->contains(part)) return nullptr;
    t = &t->at(part);
    rest = dot == std::string::npos ? "" : rest.substr(dot + 1);
  }
  if (!t->is_table() || !t->contains(name)) return nullptr;
  return &t->at(name);
}

// Every leaf key of the file must be one the format knows (a typo must not be ignored).
void check_known(const toml::value& t, const std::string& prefix, const std::string& file) {
  for (const auto& [name, v] : t.as_table()) {
    const std::string dotted = prefix.empty() ? name : prefix + "." + name;
    if (v.is_table()) {
      check_known(v, dotted, file);
      continue;
    }
    bool known = std::find(other_keys().begin(), other_keys().end(), dotted) != other_keys().end();
    for (const NumberKey& k : number_keys())
      known = known || dotted == std::string(k.section) + "." + k.name;
    if (!known) fail(at(file, v) + ": unknown key '" + dotted + "' in a machine file");
  }
}

double positive_number(const toml::value& v, const std::string& file, const std::string& key) {
  double x = -1;
  if (v.is_integer()) x = static_cast<double>(v.as_integer());
  if (v.is_floating()) x = v.as_floating();
  if (!(x > 0) || !std::isfinite(x))
    fail(at(file, v) + ": " + key + ": expected a number > 0, got " + describe(v));
  return x;
}

const toml::value& required(const toml::value& root, const std::string& file,
                            const std::string& section, const std::string& name) {
  const toml::value* v = lookup(root, section, name);
  if (!v) fail(file + ": missing key '" + section + "." + name + "'");
  return *v;
}

std::string string_key(const toml::value& root, const std::string& file, const std::string& section,
                       const std::string& name) {
  const toml::value& v = required(root, file, section, name);
  if (!v.is_string()) fail(at(file, v) + ": " + section + "." + name + ": expected a string");
  return v.as_string().str;
}

int count_key(const toml::value& root, const std::string& file, const std::string& section,
              const std::string& name) {
  const toml::value& v = required(root, file, section, name);
  if (!v.is_integer() || v.as_integer() < 1 || v.as_integer() > (1 << 20))
    fail(at(file, v) + ": " + section + "." + name + ": expected an integer from 1 to 1048576, got " +
         describe(v));
  return static_cast<int>(v.as_integer());
}

std::vector<GemmPoint> gemm_curve(const toml::value& root, const std::string& file) {
  const std::string key = "device.gemm_efficiency";
  const toml::value& v = required(root, file, "device", "gemm_efficiency");
  const std::string form = ": " + key + ": expected an array of [flops, efficiency] pairs";
  if (!v.is_array() || v.as_array().empty()) fail(at(file, v) + form);
  std::vector<GemmPoint> curve;
  for (const toml::value& p : v.as_array()) {
    if (!p.is_array() || p.as_array().size() != 2) fail(at(file, p) + form + ", got " + describe(p));
    const GemmPoint g{positive_number(p.as_array()[0], file, key + " flops"),
                      positive_number(p.as_array()[1], file, key + " efficiency")};
    if (g.efficiency > 1) fail(at(file, p) + ": " + key + ": an efficiency is at most 1, got " + describe(p));
    if (!curve.empty() && g.flops <= curve.back().flops)
      fail(at(file, p) + ": " + key + ": flops must increase from one point to the next");
    curve.push_back(g);
  }
  return curve;
}

// One [[device.attention]] table: a library's published rates by sequence length.
const char* const kAttentionKeys[] = {"library", "head_dim", "source", "seq_len",
                                      "forward_causal_tflops", "forward_tflops", "backward_tflops"};

std::vector<double> rate_row(const toml::value& table, const std::string& file, const std::string& key,
                             std::size_t length) {
  const std::string name = "device.attention." + key;
  if (!table.contains(key)) fail(at(file, table) + ": missing key '" + name + "'");
  const toml::value& v = table.at(key);
  if (!v.is_array() || v.as_array().empty()) fail(at(file, v) + ": " + name + ": expected an array of numbers");
  std::vector<double> row;
  for (const toml::value& x : v.as_array()) row.push_back(positive_number(x, file, name));
  if (length && row.size() != length)
    fail(at(file, v) + ": " + name + ": expected " + std::to_string(length) + " numbers (one per seq_len), got " +
         std::to_string(row.size()));
  return row;
}

AttentionRates attention_table(const toml::value& t, const std::string& file) {
  if (!t.is_table()) fail(at(file, t) + ": device.attention: expected tables ([[device.attention]])");
  for (const auto& [name, v] : t.as_table())
    if (std::find(std::begin(kAttentionKeys), std::end(kAttentionKeys), name) == std::end(kAttentionKeys))
      fail(at(file, v) + ": unknown key 'device.attention." + name + "' in a machine file");
  auto text = [&](const char* key) {
    if (!t.contains(key)) fail(at(file, t) + ": missing key 'device.attention." + key + "'");
    if (!t.at(key).is_string()) fail(at(file, t.at(key)) + ": device.attention." + key + ": expected a string");
    return t.at(key).as_string().str;
  };
  AttentionRates r;
  r.library = text("library");
  if (std::find_if(std::begin(kAttentionLibraries), std::end(kAttentionLibraries),
                   [&](const char* l) { return r.library == l; }) == std::end(kAttentionLibraries))
    fail(at(file, t.at("library")) + ": device.attention.library: expected \"cudnn\", \"flash2\" or \"pdtrain\", got \"" +
         r.library + "\"");
  r.source = text("source");
  if (!t.contains("head_dim")) fail(at(file, t) + ": missing key 'device.attention.head_dim'");
  r.head_dim = positive_number(t.at("head_dim"), file, "device.attention.head_dim");
  r.seq_len = rate_row(t, file, "seq_len", 0);
  if (!std::is_sorted(r.seq_len.begin(), r.seq_len.end(), std::less_equal<double>()))
    fail(at(file, t.at("seq_len")) + ": device.attention.seq_len: must increase from one entry to the next");
  for (auto [key, row] : {std::pair{"forward_causal_tflops", &r.forward_causal},
                          std::pair{"forward_tflops", &r.forward}, std::pair{"backward_tflops", &r.backward}}) {
    *row = rate_row(t, file, key, r.seq_len.size());
    for (double& x : *row) x *= kTera;
  }
  return r;
}

std::vector<AttentionRates> attention_tables(const toml::value& root, const std::string& file) {
  const toml::value* v = lookup(root, "device", "attention");
  if (!v) return {};
  if (!v->is_array()) fail(at(file, *v) + ": device.attention: expected tables ([[device.attention]])");
  std::vector<AttentionRates> tables;
  for (const toml::value& t : v->as_array()) {
    tables.push_back(attention_table(t, file));
    for (std::size_t i = 0; i + 1 < tables.size(); ++i)
      if (tables[i].library == tables.back().library)
        fail(at(file, t) + ": device.attention: a second table for library \"" + tables.back().library + "\"");
  }
  return tables;
}

// Linear in log(T) between the table's points, held at its ends (as the GEMM curve).
double interpolate_log(const std::vector<double>& x, const std::vector<double>& y, double at_x) {
  if (at_x <= x.front()) return y.front();
  if (at_x >= x.back()) return y.back();
  const std::size_t hi = static_cast<std::size_t>(std::upper_bound(x.begin(), x.end(), at_x) - x.begin());
  const std::size_t lo = hi - 1;
  const double t = std::log(at_x / x[lo]) / std::log(x[hi] / x[lo]);
  return y[lo] + t * (y[hi] - y[lo]);
}

// The SM count is a whole number of SMs (at most 1024) and the clock one a GPU runs at (100 MHz
// to 5 GHz): a figure outside is a typo (a clock in GHz or Hz, a core count for SMs).
void check_gpu_cores(const toml::value& root, const std::string& file, const DeviceSpec& d) {
  if (const toml::value* v = lookup(root, "device", "sm_count");
      v && (!v->is_integer() || d.sm_count > 1024))
    fail(at(file, *v) + ": device.sm_count: expected an integer from 1 to 1024, got " + describe(*v));
  if (const toml::value* v = lookup(root, "device", "sm_clock_mhz");
      v && (d.sm_clock_hz < 100e6 || d.sm_clock_hz > 5000e6))
    fail(at(file, *v) + ": device.sm_clock_mhz: expected 100 to 5000 (MHz), got " + describe(*v));
}

}  // namespace

double AttentionRates::forward_causal_at(double T) const { return interpolate_log(seq_len, forward_causal, T); }
double AttentionRates::forward_at(double T) const { return interpolate_log(seq_len, forward, T); }
double AttentionRates::backward_at(double T) const { return interpolate_log(seq_len, backward, T); }
double AttentionRates::backward_causal_at(double T) const {
  return backward_at(T) * std::min(1.0, forward_causal_at(T) / forward_at(T));
}

const AttentionRates* DeviceSpec::attention_rates(const std::string& library) const {
  for (const AttentionRates& r : attention)
    if (r.library == library) return &r;
  return nullptr;
}

double DeviceSpec::gemm_efficiency(double flops) const {
  if (gemm.empty()) return 1.0;
  if (flops <= gemm.front().flops) return gemm.front().efficiency;
  if (flops >= gemm.back().flops) return gemm.back().efficiency;
  const auto hi = std::upper_bound(gemm.begin(), gemm.end(), flops,
                                   [](double f, const GemmPoint& p) { return f < p.flops; });
  const auto lo = hi - 1;
  const double t = std::log(flops / lo->flops) / std::log(hi->flops / lo->flops);
  return lo->efficiency + t * (hi->efficiency - lo->efficiency);
}

Machine parse_machine(const std::string& text, const std::string& file) {
  const toml::value root = deck::parse_toml(text, file, "machine file");
  check_known(root, "", file);
  Machine m;
  m.name = string_key(root, file, "machine", "name");
  const toml::value& sources = required(root, file, "machine", "sources");
  if (!sources.is_array() || sources.as_array().empty())
    fail(at(file, sources) + ": machine.sources: expected a non-empty array of strings (where "
                             "the figures come from)");
  for (const toml::value& s : sources.as_array()) {
    if (!s.is_string()) fail(at(file, s) + ": machine.sources: expected strings");
    m.sources.push_back(s.as_string().str);
  }
  m.device.name = string_key(root, file, "device", "name");
  const std::string kind = string_key(root, file, "device", "kind");
  if (kind != "gpu" && kind != "cpu")
    fail(at(file, *lookup(root, "device", "kind")) + ": device.kind: expected \"gpu\" or \"cpu\", got \"" +
         kind + "\"");
  m.device.gpu = kind == "gpu";
  m.device.gemm = gemm_curve(root, file);
  m.device.attention = attention_tables(root, file);
  m.node.devices = count_key(root, file, "node", "devices");
  m.node.cpu_cores = count_key(root, file, "node", "cpu_cores");
  for (const NumberKey& k : number_keys()) {
    const toml::value* v = lookup(root, k.section, k.name);
    const bool needed = k.required || (m.device.gpu && std::string(k.section) == "link.host");
    if (!v && needed) fail(file + ": missing key '" + k.section + "." + k.name + "' (" + k.unit + ")");
    if (v) k.field(m) = k.scale * positive_number(*v, file, std::string(k.section) + "." + k.name);
  }
  check_gpu_cores(root, file, m.device);
  if (m.node.wait_core_share >= 1)
    fail(at(file, *lookup(root, "node", "wait_core_share")) +
         ": node.wait_core_share: a waiting rank takes less than a whole core, got " +
         describe(*lookup(root, "node", "wait_core_share")));
  return m;
}

Machine load_machine(const std::string& path) {
  return parse_machine(deck::read_toml_text(path, "machine"), path);
}

std::string machine_toml(const Machine& m) {
  std::ostringstream out;
  out.precision(6);
  out << "# pdtrain machine file (docs/performance-model.md)\n[machine]\nname = "
      << toml::value(m.name) << "\nsources = [";
  for (std::size_t i = 0; i < m.sources.size(); ++i)
    out << (i ? ", " : "") << toml::value(m.sources[i]);
  out << "]\n";
  Machine copy = m;
  std::string section;
  auto open = [&](const std::string& s) {
    if (s == section) return;
    out << "\n[" << s << "]\n", section = s;
    if (s == "node") out << "devices = " << m.node.devices << "\ncpu_cores = " << m.node.cpu_cores << "\n";
  };
  open("device");
  out << "name = " << toml::value(m.device.name) << "\nkind = \"" << (m.device.gpu ? "gpu" : "cpu")
      << "\"\ngemm_efficiency = [";
  for (std::size_t i = 0; i < m.device.gemm.size(); ++i)
    out << (i ? ", " : "") << "[" << m.device.gemm[i].flops << ", " << m.device.gemm[i].efficiency << "]";
  out << "]\n";
  for (const NumberKey& k : number_keys()) {
    const double v = k.field(copy);
    if (v <= 0) continue;  // an optional key left out
    open(k.section);
    out << k.name << " = " << v / k.scale << "\n";
  }
  auto row = [&](const char* key, const std::vector<double>& xs, double scale) {
    out << key << " = [";
    for (std::size_t i = 0; i < xs.size(); ++i) out << (i ? ", " : "") << xs[i] / scale;
    out << "]\n";
  };
  for (const AttentionRates& r : m.device.attention) {
    out << "\n[[device.attention]]\nlibrary = " << toml::value(r.library) << "\nhead_dim = " << r.head_dim
        << "\nsource = " << toml::value(r.source) << "\n";
    row("seq_len", r.seq_len, 1);
    row("forward_causal_tflops", r.forward_causal, kTera);
    row("forward_tflops", r.forward, kTera);
    row("backward_tflops", r.backward, kTera);
  }
  return out.str();
}

}  // namespace pdtrain::plan
