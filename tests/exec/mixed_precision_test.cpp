// The host side of mixed precision: bf16 rounding (bit patterns worked out by hand from IEEE 754),
// conversions in the CPU backend, the emulation's rounding of every stored output, the parameters'
// compute copy, and the caching allocator the CUDA backend puts its tensors in.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "sextant/exec/block_pool.hpp"
#include "sextant/exec/cpu_backend.hpp"
#include "sextant/exec/parameters.hpp"

namespace sextant::exec {
namespace {

float bits_to_float(uint32_t u) {
  float f = 0;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(to_bf16(1.0f), 0x3F80);   // exact
  EXPECT_EQ(to_bf16(-2.0f), 0xC000);  // exact, sign kept
  // 1 + 2^-8 lies halfway between 1 (0x3F80) and 1 + 2^-7 (0x3F81): ties go to the even 0x3F80.
  EXPECT_EQ(to_bf16(bits_to_float(0x3F808000u)), 0x3F80);
  // 1 + 3 * 2^-8 is halfway between 0x3F81 and 0x3F82: to the even 0x3F82.
  EXPECT_EQ(to_bf16(bits_to_float(0x3F818000u)), 0x3F82);
  // Just above halfway rounds up, just below rounds down.
  EXPECT_EQ(to_bf16(bits_to_float(0x3F808001u)), 0x3F81);
  EXPECT_EQ(to_bf16(bits_to_float(0x3F807FFFu)), 0x3F80);
  // The largest float rounds up to infinity; infinities and NaN stay what they are.
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits in the dropped half must not round into infinity.
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(bits_to_float(0x7F800001u)))));
  EXPECT_EQ(from_bf16(0x3F81), 1.0078125f);
}

TEST(Bf16, CpuBackendConvertsOnCopyAndHostTransfers) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  Tensor h = be->empty({3}, DType::kBF16);
  EXPECT_EQ(h.bytes(), 6);
  be->from_host({1.0f, 1.00390625f /* 1 + 2^-8: a tie, to 1 */, -3.1f}, h);
  std::vector<float> back;
  be->to_host(h, back);
  EXPECT_EQ(back, (std::vector<float>{1.0f, 1.0f, from_bf16(to_bf16(-3.1f))}));
  Tensor f = be->empty({3});
  be->copy(h, f);
  EXPECT_EQ(f.data()[2], from_bf16(to_bf16(-3.1f)));
  be->fill(h, 0.1f);
  be->to_host(h, back);
  EXPECT_EQ(back[1], from_bf16(to_bf16(0.1f)));
  // fp32 access to a bf16 tensor is a programming error, not a silent reinterpretation.
  EXPECT_THROW((void)h.data(), std::logic_error);
}

TEST(Bf16, EmulationRoundsTheOutputOfEachKernelOnce) {
  std::unique_ptr<Backend> be = make_cpu_bf16_emulation();
  ASSERT_EQ(be->activation_dtype(), DType::kBF16);
  std::mt19937 rng(7);
  std::normal_distribution<float> d;
  const int64_t n = 8, k = 16, m = 4;
  std::vector<float> xs(n * k), ws(k * m);
  for (float& v : xs) v = from_bf16(to_bf16(d(rng)));  // representable inputs
  for (float& v : ws) v = from_bf16(to_bf16(d(rng)));
  Tensor x = be->empty({n, k}, DType::kBF16), w = be->empty({k, m}, DType::kBF16);
  Tensor y = be->empty({n, m}, DType::kBF16);
  be->from_host(xs, x);
  be->from_host(ws, w);
  be->matmul(x, w, nullptr, y);
  std::vector<float> got;
  be->to_host(y, got);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      double s = 0;
      for (int64_t l = 0; l < k; ++l) s += static_cast<double>(xs[i * k + l]) * ws[l * m + j];
      // The product in double rounded to bf16; fp32 accumulation may move it by one bf16 step.
      const float want = from_bf16(to_bf16(static_cast<float>(s)));
      EXPECT_NEAR(got[i * m + j], want, std::fabs(want) * 1.0 / 128 + 1e-6) << i << "," << j;
      EXPECT_EQ(got[i * m + j], from_bf16(to_bf16(got[i * m + j]))) << "not a bf16 value";
    }
  }
  // Weight gradients stay fp32: dw += x^T dy accumulates unrounded.
  Tensor dy = be->empty({n, m}, DType::kBF16);
  be->fill(dy, 1.0f);
  Tensor dw = be->zeros({k, m});
  be->matmul_backward(x, w, dy, nullptr, dw, nullptr);
  double col = 0;
  for (int64_t i = 0; i < n; ++i) col += xs[i * k + 0];
  EXPECT_NEAR(dw.data()[0], col, 1e-5);
}

TEST(Bf16, ParameterComputeCopyIsTheRoundedMasterValue) {
  std::unique_ptr<Backend> be = make_cpu_bf16_emulation();
  ParamSpec spec{"w", 0, {4}, [](int64_t i) { return 1.0f + static_cast<float>(i) / 1000; }};
  ParamStore store(*be, {spec});
  Param& p = store.get("w");
  EXPECT_EQ(p.value.dtype(), DType::kF32);
  EXPECT_EQ(p.grad.dtype(), DType::kF32);
  ASSERT_EQ(p.compute.dtype(), DType::kBF16);
  std::vector<float> c;
  be->to_host(p.compute, c);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(c[i], from_bf16(to_bf16(p.value.data()[i])));
  // An update moves the master value; the copy follows only when refreshed.
  p.value.data()[1] = 2.5f;
  be->to_host(p.compute, c);
  EXPECT_NE(c[1], 2.5f);
  store.refresh_compute(1, 2);
  be->to_host(p.compute, c);
  EXPECT_EQ(c[1], 2.5f);
  // fp32 training reads the master values themselves.
  std::unique_ptr<Backend> fp32 = make_cpu_backend();
  ParamStore plain(*fp32, {spec});
  EXPECT_EQ(plain.get("w").compute.raw(), plain.get("w").value.raw());
}

// A host stand-in for cudaMalloc / cudaFree that can run out of memory.
struct FakeDevice {
  explicit FakeDevice(int64_t bytes) : capacity(bytes) {}
  int64_t capacity = 0, used = 0;
  std::map<void*, int64_t> blocks;
  void* alloc(int64_t bytes) {
    if (used + bytes > capacity) return nullptr;
    void* p = ::operator new(static_cast<size_t>(bytes));
    blocks[p] = bytes;
    used += bytes;
    return p;
  }
  void free(void* p) {
    used -= blocks.at(p);
    blocks.erase(p);
    ::operator delete(p);
  }
};

TEST(BlockPool, SizeClasses) {
  EXPECT_EQ(BlockPool::size_class(0), 512);
  EXPECT_EQ(BlockPool::size_class(1), 512);
  EXPECT_EQ(BlockPool::size_class(512), 512);
  EXPECT_EQ(BlockPool::size_class(513), 1024);
  EXPECT_EQ(BlockPool::size_class(1 << 20), 1 << 20);
  EXPECT_EQ(BlockPool::size_class((1 << 20) + 1), 2 << 20);
  EXPECT_EQ(BlockPool::size_class((6 << 20) + 1), 8 << 20);
}

TEST(BlockPool, ReusesFreedBlocksOfTheSameClass) {
  FakeDevice dev(1 << 24);
  {
    BlockPool pool([&](int64_t b) { return dev.alloc(b); }, [&](void* p) { dev.free(p); });
    void* a = pool.allocate(1000);
    void* b = pool.allocate(1000);
    EXPECT_NE(a, b);
    pool.release(a);
    EXPECT_EQ(pool.cached_bytes(), 1024);
    EXPECT_EQ(pool.allocate(900), a);  // same class (1024): the cached block
    EXPECT_EQ(pool.raw_allocations(), 2);
    void* c = pool.allocate(3000);  // another class: a new block
    EXPECT_NE(c, a);
    EXPECT_EQ(pool.raw_allocations(), 3);
    EXPECT_EQ(pool.live_bytes(), 1024 + 1024 + 3072);
    pool.release(a);
    pool.release(b);
    pool.release(c);
    EXPECT_EQ(pool.live_bytes(), 0);
    EXPECT_THROW(pool.release(&dev), std::logic_error);  // never handed out
  }
  EXPECT_EQ(dev.used, 0);  // the pool gave every block back when it went
}

TEST(BlockPool, ReleasesTheCacheWhenTheDeviceIsFull) {
  FakeDevice dev(4 << 20);
  BlockPool pool([&](int64_t b) { return dev.alloc(b); }, [&](void* p) { dev.free(p); });
  void* a = pool.allocate(2 << 20);
  void* b = pool.allocate(2 << 20);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  pool.release(a);
  pool.release(b);
  // 4 MiB cached in 2 MiB blocks; a 4 MiB block fits only once they are given back.
  void* big = pool.allocate(4 << 20);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(pool.cached_bytes(), 0);
  EXPECT_EQ(pool.allocate(512), nullptr);  // truly full
  pool.release(big);
}

// The CPU backend caches blocks too: a freed activation's memory comes back for the next one of
// its size instead of fresh (page-faulting) pages from the system allocator.
TEST(BlockPool, TheCpuBackendReusesFreedBlocks) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  void* a = be->allocate(3 << 20);
  be->release(a);
  void* b = be->allocate((3 << 20) - 100);  // same 4 MiB class
  EXPECT_EQ(b, a);
  be->release(b);
}

}  // namespace
}  // namespace sextant::exec
