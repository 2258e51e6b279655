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
                                                "device.kind", "device.gemm_efficiency",
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
  return out.str();
}

}  // namespace pdtrain::plan
