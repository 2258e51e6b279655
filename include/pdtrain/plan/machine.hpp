#pragma once
// A machine description for `pdtrain plan` (docs/performance-model.md, "Machine files"): what
// one compute device, one node and the links between them can do, in SI units. Read from a
// TOML file (machines/*.toml); every value is checked, errors name the file, line and key.
#include <cstdint>
#include <string>
#include <vector>

namespace pdtrain::plan {

// One point of a device's GEMM curve: a single matrix product of `flops` floating-point
// operations runs at `efficiency` x the device's peak.
struct GemmPoint {
  double flops = 0, efficiency = 0;
};

// What one attention library was published to reach on this device ([[device.attention]] in a
// machine file), in FlashAttention's count of FLOPs: the forward 4·T²·hd per sequence and head
// (half of it causal), the backward 2.5 times its forward. Rates at head size `head_dim` by
// sequence length, interpolated linearly in log(T) and held at the table's ends.
struct AttentionRates {
  // "cudnn" (cuDNN's fused SDPA), "flash2" (FlashAttention-2), or "pdtrain": the lower bound of
  // pdtrain's own fused kernels' time counted in the emulation (perf/kernel_counts.sh) on this
  // device, as the rate it allows (its tables are causal: forward = forward_causal).
  std::string library;
  double head_dim = 0;
  std::string source;   // where the figures were published
  std::vector<double> seq_len;                            // ascending
  std::vector<double> forward_causal, forward, backward;  // flop/s, one per seq_len
  double forward_causal_at(double T) const;
  double forward_at(double T) const;
  double backward_at(double T) const;
  // The causal backward is not published: the non-causal backward scaled as the forward is by
  // the mask (backward x forward_causal / forward at the same T), never faster than either.
  double backward_causal_at(double T) const;
  // The factor a head of `hd` channels reaches of this table's rates: a narrower head does the
  // same per-element softmax and memory work for fewer FLOPs (hd / head_dim); a wider head is
  // priced at this table's rates (published wider heads run faster, so this never flatters).
  double head_factor(double hd) const { return hd < head_dim ? hd / head_dim : 1.0; }
};

// The attention tables a machine file knows.
inline const char* const kAttentionLibraries[] = {"cudnn", "flash2", "pdtrain"};

struct DeviceSpec {
  std::string name;
  bool gpu = true;  // false: a CPU node whose compute ranks share its cores and memory
  double memory_bytes = 0;
  double memory_bandwidth = 0;  // bytes/s
  double peak_fp32 = 0, peak_bf16 = 0;  // flop/s (bf16: tensor cores / AMX; = fp32 on AVX2)
  // The rate of the model's elementwise kernels (LayerNorm, GELU, residuals, biases, softmax,
  // the zeroing of gradient buffers), in the bytes the model counts for them per second, for
  // the whole device (a CPU node: cores x one thread's rate, as --calibrate measures it);
  // 0 (the key left out): memory_bandwidth, what GPU kernels of this kind run at.
  double elementwise_rate = 0;
  double elementwise() const { return elementwise_rate > 0 ? elementwise_rate : memory_bandwidth; }
  double kernel_overhead_s = 0;  // fixed cost per kernel launch
  // A GPU's streaming multiprocessors and their clock (hertz; the highest boost clock, so that a
  // time bound from cycles stays a lower bound): perf/kernel_counts.sh's per-kernel time bounds.
  // 0: the optional keys left out.
  double sm_count = 0, sm_clock_hz = 0;
  std::vector<GemmPoint> gemm;   // ascending in flops
  std::vector<AttentionRates> attention;  // published fused-attention rates (GPUs; may be empty)
  const AttentionRates* attention_rates(const std::string& library) const;
  // Fraction of peak one GEMM of `flops` reaches: the curve interpolated linearly in log(flops),
  // held at its ends.
  double gemm_efficiency(double flops) const;
};

struct LinkSpec {
  double latency_s = 0;
  double bandwidth = 0;  // bytes/s, per direction, per device (or per rank on a CPU node)
  double time(double bytes) const { return bytes > 0 ? latency_s + bytes / bandwidth : 0.0; }
};

struct NodeSpec {
  int devices = 1;  // compute devices (GPUs) per node; a CPU node counts as one device
  int cpu_cores = 1;
  double cpu_memory_bytes = 0;
  double cpu_memory_bandwidth = 0;  // bytes/s
  // The share of a core a rank still takes while it waits for MPI: pdtrain's quiet wait polls,
  // then sleeps up to 200 us, and every timer wake-up costs CPU time (25-30 us in the KVM guest
  // of perf/RESULTS.md, a few on bare metal). --calibrate measures it; 0 (the key left out):
  // waits cost the node nothing.
  double wait_core_share = 0;
};

// What a holder's cores do per second: the fused AdamW update (read value, gradient, two
// moments; write them and the encoded copy) and CRC32C over served bytes.
struct HolderSpec {
  double adamw_params_per_core = 0;  // parameters/s
  double crc_bytes_per_core = 0;     // bytes/s
};

struct Machine {
  std::string name;
  std::vector<std::string> sources;  // where the figures come from (specs, a calibration)
  DeviceSpec device;
  NodeSpec node;
  LinkSpec intra, inter;  // between ranks of one node, between nodes
  LinkSpec host;          // host <-> device (PCIe); unused on a CPU node
  HolderSpec holder;
};

// `text` is the file's contents, `file` its name for errors. Throws Error(ExitCode::deck)
// naming FILE:LINE and the key for a syntax error, an unknown or missing key, a wrong type or
// a value out of range.
Machine parse_machine(const std::string& text, const std::string& file);
Machine load_machine(const std::string& path);

// The machine as a TOML machine file (what --calibrate writes); parse_machine reads it back.
std::string machine_toml(const Machine& m);

}  // namespace pdtrain::plan
