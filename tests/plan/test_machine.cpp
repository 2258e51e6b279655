// Machine files: the shipped ones read back with their published figures; every mistake in a
// file is an Error(deck) naming the file, line and key.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "pdtrain/core/error.hpp"
#include "pdtrain/plan/machine.hpp"

namespace pdtrain::plan {
namespace {

const std::string kMachines = PDTRAIN_SOURCE_DIR "/machines/";

const char* kMinimal = R"(
[machine]
name = "test"
sources = ["made up for the test"]
[device]
name = "dev"
kind = "gpu"
memory_gib = 16
memory_bandwidth_gbs = 1000
peak_tflops_fp32 = 10
peak_tflops_bf16 = 100
gemm_efficiency = [[1e9, 0.2], [1e11, 0.8]]
[node]
devices = 4
cpu_cores = 32
cpu_memory_gib = 256
cpu_memory_bandwidth_gbs = 200
[link.intra]
latency_us = 2
bandwidth_gbs = 100
[link.inter]
latency_us = 5
bandwidth_gbs = 10
[link.host]
latency_us = 10
bandwidth_gbs = 20
[holder]
adamw_mparams_per_core = 400
crc_gbs_per_core = 8
)";

// The message of the error parsing `text` throws (empty if none).
std::string error_of(const std::string& text) {
  try {
    parse_machine(text, "m.toml");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::deck);
    return e.what();
  }
  return "";
}

std::string with(const std::string& from, const std::string& to, std::string t = kMinimal) {
  const auto at = t.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return t.replace(at, from.size(), to);
}

TEST(Machine, ShippedFilesCarryTheirPublishedFigures) {
  const Machine a100 = load_machine(kMachines + "a100-80gb.toml");
  EXPECT_DOUBLE_EQ(a100.device.peak_bf16, 312e12);
  EXPECT_DOUBLE_EQ(a100.device.memory_bandwidth, 2039e9);
  EXPECT_EQ(a100.node.devices, 8);
  EXPECT_DOUBLE_EQ(a100.inter.bandwidth, 25e9);
  const Machine h100 = load_machine(kMachines + "h100-sxm.toml");
  EXPECT_DOUBLE_EQ(h100.device.peak_bf16, 989.5e12);
  EXPECT_DOUBLE_EQ(h100.device.memory_bandwidth, 3350e9);
  const Machine h200 = load_machine(kMachines + "h200.toml");
  EXPECT_DOUBLE_EQ(h200.device.memory_bandwidth, 4800e9);
  EXPECT_GT(h200.device.memory_bytes, h100.device.memory_bytes);
  for (const Machine* m : {&a100, &h100, &h200}) EXPECT_GE(m->sources.size(), 3u) << m->name;
}

TEST(Machine, ReadsUnitsIntoSiAndInterpolatesTheGemmCurveInLogFlops) {
  const Machine m = parse_machine(kMinimal, "m.toml");
  EXPECT_DOUBLE_EQ(m.device.memory_bytes, 16.0 * (1 << 30));
  EXPECT_DOUBLE_EQ(m.intra.latency_s, 2e-6);
  EXPECT_DOUBLE_EQ(m.holder.adamw_params_per_core, 400e6);
  EXPECT_DOUBLE_EQ(m.device.gemm_efficiency(1e8), 0.2);   // held at the ends
  EXPECT_DOUBLE_EQ(m.device.gemm_efficiency(1e12), 0.8);
  EXPECT_NEAR(m.device.gemm_efficiency(1e10), 0.5, 1e-12);  // halfway in log(flops)
}

TEST(Machine, ElementwiseRateDefaultsToMemoryBandwidth) {
  const Machine gpu = parse_machine(kMinimal, "m.toml");
  EXPECT_DOUBLE_EQ(gpu.device.elementwise(), 1000e9);  // left out: memory bound
  const Machine cpu = parse_machine(with("memory_bandwidth_gbs = 1000\n",
                                         "memory_bandwidth_gbs = 1000\nelementwise_gbs = 250\n"),
                                    "m.toml");
  EXPECT_DOUBLE_EQ(cpu.device.elementwise(), 250e9);
  EXPECT_DOUBLE_EQ(parse_machine(machine_toml(cpu), "w.toml").device.elementwise_rate, 250e9);
  EXPECT_NE(error_of(with("memory_bandwidth_gbs = 1000\n",
                          "memory_bandwidth_gbs = 1000\nelementwise_gbs = 0\n"))
                .find("device.elementwise_gbs"),
            std::string::npos);
}

// A waiting rank's share of a core: left out, waits cost nothing; a share of a whole core or
// more is a mistake (a rank that waits does not compute).
TEST(Machine, WaitCoreShareIsOptionalAndBelowOne) {
  EXPECT_EQ(parse_machine(kMinimal, "m.toml").node.wait_core_share, 0);
  const std::string shared = with("cpu_cores = 32\n", "cpu_cores = 32\nwait_core_share = 0.125\n");
  const Machine m = parse_machine(shared, "m.toml");
  EXPECT_DOUBLE_EQ(m.node.wait_core_share, 0.125);
  EXPECT_DOUBLE_EQ(parse_machine(machine_toml(m), "w.toml").node.wait_core_share, 0.125);
  EXPECT_EQ(error_of(with("cpu_cores = 32\n", "cpu_cores = 32\nwait_core_share = 1\n")),
            "m.toml:16: node.wait_core_share: a waiting rank takes less than a whole core, got 1");
  EXPECT_EQ(error_of(with("cpu_cores = 32\n", "cpu_cores = 32\nwait_core_share = -0.1\n")),
            "m.toml:16: node.wait_core_share: expected a number > 0, got -0.1");
}

// The SMs and their clock (perf/kernel_counts.sh's time bounds): optional, read in SMs and MHz,
// written back; a count that is no whole number of SMs or a clock in the wrong unit is refused.
TEST(Machine, SmCountAndClockAreOptionalAndChecked) {
  EXPECT_EQ(parse_machine(kMinimal, "m.toml").device.sm_count, 0);
  const std::string cores =
      with("memory_bandwidth_gbs = 1000\n", "memory_bandwidth_gbs = 1000\nsm_count = 132\nsm_clock_mhz = 1980\n");
  const Machine m = parse_machine(cores, "m.toml");
  EXPECT_DOUBLE_EQ(m.device.sm_count, 132);
  EXPECT_DOUBLE_EQ(m.device.sm_clock_hz, 1980e6);
  const Machine back = parse_machine(machine_toml(m), "w.toml");
  EXPECT_DOUBLE_EQ(back.device.sm_count, 132);
  EXPECT_DOUBLE_EQ(back.device.sm_clock_hz, 1980e6);
  EXPECT_EQ(error_of(with("sm_count = 132", "sm_count = 132.5", cores)),
            "m.toml:10: device.sm_count: expected an integer from 1 to 1024, got 132.5");
  EXPECT_EQ(error_of(with("sm_count = 132", "sm_count = 2048", cores)),
            "m.toml:10: device.sm_count: expected an integer from 1 to 1024, got 2048");
  EXPECT_EQ(error_of(with("sm_clock_mhz = 1980", "sm_clock_mhz = 1.98", cores)),
            "m.toml:11: device.sm_clock_mhz: expected 100 to 5000 (MHz), got 1.98");
  const Machine h100 = load_machine(kMachines + "h100-sxm.toml");
  const Machine h200 = load_machine(kMachines + "h200.toml");
  for (const Machine* g : {&h100, &h200}) {
    EXPECT_DOUBLE_EQ(g->device.sm_count, 132) << g->name;
    EXPECT_DOUBLE_EQ(g->device.sm_clock_hz, 1980e6) << g->name;
  }
}

TEST(Machine, WrittenFileReadsBackTheSame) {
  const Machine m = parse_machine(kMinimal, "m.toml");
  const Machine back = parse_machine(machine_toml(m), "written.toml");
  EXPECT_EQ(back.name, m.name);
  EXPECT_EQ(back.sources, m.sources);
  EXPECT_DOUBLE_EQ(back.device.peak_bf16, m.device.peak_bf16);
  EXPECT_DOUBLE_EQ(back.inter.bandwidth, m.inter.bandwidth);
  EXPECT_DOUBLE_EQ(back.host.latency_s, m.host.latency_s);
  EXPECT_EQ(back.node.cpu_cores, m.node.cpu_cores);
  ASSERT_EQ(back.device.gemm.size(), 2u);
  EXPECT_DOUBLE_EQ(back.device.gemm[1].efficiency, 0.8);
}

TEST(Machine, MistakesNameFileLineAndKey) {
  EXPECT_EQ(error_of(with("crc_gbs_per_core = 8", "crc_gbs_per_core = 8\ncrc_gbz = 1")),
            "m.toml:30: unknown key 'holder.crc_gbz' in a machine file");
  EXPECT_EQ(error_of(with("memory_gib = 16\n", "")), "m.toml: missing key 'device.memory_gib' (GiB)");
  EXPECT_EQ(error_of(with("bandwidth_gbs = 10\n[link.host]", "bandwidth_gbs = -10\n[link.host]")),
            "m.toml:23: link.inter.bandwidth_gbs: expected a number > 0, got -10");
  EXPECT_EQ(error_of(with("kind = \"gpu\"", "kind = \"tpu\"")),
            "m.toml:7: device.kind: expected \"gpu\" or \"cpu\", got \"tpu\"");
  EXPECT_EQ(error_of(with("[1e11, 0.8]", "[1e8, 0.8]")),
            "m.toml:12: device.gemm_efficiency: flops must increase from one point to the next");
  EXPECT_EQ(error_of(with("[1e11, 0.8]", "[1e11, 1.5]")).substr(0, 60),
            "m.toml:12: device.gemm_efficiency: an efficiency is at most ");
  EXPECT_EQ(error_of(with("devices = 4", "devices = 0")).substr(0, 52),
            "m.toml:14: node.devices: expected an integer from 1 ");
  EXPECT_EQ(error_of("[machine\n").substr(0, 29), "m.toml:1: TOML syntax error: ");
}

TEST(Machine, MissingFileIsADeckErrorNamingIt) {
  try {
    load_machine("/nonexistent/m.toml");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::deck);
    EXPECT_EQ(std::string(e.what()), "cannot read machine file '/nonexistent/m.toml': No such file or directory");
  }
}

TEST(Machine, CpuNodeNeedsNoHostLink) {
  std::string t = with("kind = \"gpu\"", "kind = \"cpu\"");
  t = t.replace(t.find("[link.host]"), std::string("[link.host]\nlatency_us = 10\nbandwidth_gbs = 20\n").size(), "");
  EXPECT_FALSE(parse_machine(t, "m.toml").device.gpu);
  EXPECT_EQ(error_of(with("[link.host]\nlatency_us = 10\n", "[link.host]\n")),
            "m.toml: missing key 'link.host.latency_us' (us)");
}

// The shipped GPU files carry the FlashAttention-3 paper's head-size-64 tables (cuDNN and
// FlashAttention-2 on an H100 SXM5), read in flop/s and interpolated in log(T).
TEST(Machine, AttentionRatesArePublishedTablesInterpolatedInLogSeqLen) {
  for (const char* f : {"h100-sxm.toml", "h200.toml"}) {
    const Machine m = load_machine(kMachines + f);
    const AttentionRates* cudnn = m.device.attention_rates("cudnn");
    const AttentionRates* flash2 = m.device.attention_rates("flash2");
    ASSERT_TRUE(cudnn && flash2) << f;
    EXPECT_DOUBLE_EQ(cudnn->forward_causal_at(1024), 288e12);
    EXPECT_DOUBLE_EQ(cudnn->forward_at(1024), 373e12);
    EXPECT_DOUBLE_EQ(flash2->backward_at(1024), 238e12);
    EXPECT_NEAR(cudnn->forward_causal_at(std::sqrt(1024.0 * 2048)), (288e12 + 334e12) / 2, 1e3);
    EXPECT_DOUBLE_EQ(cudnn->forward_causal_at(64), 225e12);  // held at the ends
    EXPECT_DOUBLE_EQ(cudnn->forward_causal_at(1 << 20), 388e12);
    // Not published: the causal backward, the non-causal one scaled as the forward is.
    EXPECT_DOUBLE_EQ(cudnn->backward_causal_at(1024), 348e12 * 288e12 / 373e12);
    EXPECT_DOUBLE_EQ(cudnn->head_factor(32), 0.5);
    EXPECT_DOUBLE_EQ(cudnn->head_factor(128), 1.0);
    EXPECT_EQ(m.device.attention_rates("triton"), nullptr);
  }
  EXPECT_TRUE(load_machine(kMachines + "a100-80gb.toml").device.attention.empty());
}

const char* kAttention = R"(
[[device.attention]]
library = "cudnn"
head_dim = 64
source = "a paper"
seq_len = [512, 1024]
forward_causal_tflops = [100, 200]
forward_tflops = [150, 250]
backward_tflops = [120, 220]
)";

TEST(Machine, AttentionTablesReadBackAndTheirMistakesNameFileLineAndKey) {
  const std::string text = std::string(kMinimal) + kAttention;
  const Machine m = parse_machine(text, "m.toml");
  const Machine back = parse_machine(machine_toml(m), "w.toml");
  ASSERT_EQ(back.device.attention.size(), 1u);
  EXPECT_EQ(back.device.attention[0].source, "a paper");
  EXPECT_EQ(back.device.attention[0].backward, m.device.attention[0].backward);
  auto mistake = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    t.replace(t.find(from), from.size(), to);
    return error_of(t);
  };
  EXPECT_EQ(mistake("library = \"cudnn\"", "library = \"triton\""),
            "m.toml:32: device.attention.library: expected \"cudnn\", \"flash2\" or \"pdtrain\", got \"triton\"");
  EXPECT_EQ(mistake("backward_tflops = [120, 220]", "backward_tflops = [120]"),
            "m.toml:38: device.attention.backward_tflops: expected 2 numbers (one per seq_len), got 1");
  EXPECT_EQ(mistake("head_dim = 64", "head_dim = 64\nheaddim = 64"),
            "m.toml:34: unknown key 'device.attention.headdim' in a machine file");
  EXPECT_EQ(mistake("seq_len = [512, 1024]", "seq_len = [1024, 512]"),
            "m.toml:35: device.attention.seq_len: must increase from one entry to the next");
  EXPECT_EQ(mistake("forward_tflops = [150, 250]", "forward_tflops = [150, 0]"),
            "m.toml:37: device.attention.forward_tflops: expected a number > 0, got 0");
  EXPECT_EQ(error_of(text + kAttention).substr(0, 72),
            "m.toml:40: device.attention: a second table for library \"cudnn\"");
}

}  // namespace
}  // namespace pdtrain::plan
