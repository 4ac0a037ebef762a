// The CUDA backend against the float64 reference (and the CPU backend), every variant, on
// randomized shapes with fresh inputs. Built in every CUDA build; skipped where no GPU is
// visible (CI), run on the device machine.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <random>
#include <set>
#include <utility>

#include "attention/attention_harness.h"
#include "attention/cuda_check_support.h"
#include "specula/attention/cpu/cpu_backend.h"
#include "specula/attention/cuda/cuda_backend.h"
#include "specula/attention/cuda/kernels/prefill_wgmma.h"
#include "specula/attention/merge_state.h"
#include "specula/core/cuda_check.h"
#include "specula/core/dtype_code.h"
#include "specula/kv/mha_kv_pool.h"

namespace specula::testing {
namespace {

namespace ck = cuda_kernels;

TEST_F(CudaAttention, DecodeGqaAndMha) {
  auto rng = rng_for_shapes();
  for (auto [hq, hk] : {std::pair{8, 8}, std::pair{32, 8}, std::pair{12, 4}, std::pair{16, 2}, std::pair{6, 2}}) {
    HarnessConfig c = decode_config(hq, hk, 16, DType::bf16);
    c.requests = random_requests(rng, 5, 700, 1, ForwardMode::DECODE);
    check_cuda(c, "decode GQA");
  }
}

TEST_F(CudaAttention, DecodeSplitKvLongSequence) {
  HarnessConfig c = decode_config(8, 2, 64, DType::bf16);
  c.requests = {{6000, 1}, {3, 1}};
  c.head_dim = 128;
  check_cuda(c, "decode split-KV");
  EXPECT_GT(choose_decode_plan(2, 2, 6001, 132).splits, 1);
  EXPECT_EQ(choose_decode_plan(64, 8, 4096, 132).splits, 1) << "a full batch must not split";
}

// Both decode plans that split: a few head groups get one wide block per multiprocessor, a batch
// that half-fills the GPU gets two 4-warp blocks per multiprocessor; and a batch that fills it,
// unsplit. bf16 and fp8 caches (whose wide and 4-warp kernels take V by different paths).
TEST_F(CudaAttention, DecodeSplitPlansWideAndNarrow) {
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  auto rng = rng_for_shapes();
  std::uniform_int_distribution<int> len(1500, 2600);
  for (DType kv_dtype : {DType::bf16, DType::fp8_e4m3}) {
    for (int bs : {2, sms * 3 / 32, sms / 8 + 1}) {
      const DecodePlan plan = choose_decode_plan(bs, 8, 1500, sms);
      const bool full = bs * 8 >= sms;
      EXPECT_EQ(plan.splits > 1, !full) << "bs " << bs;
      EXPECT_EQ(plan.warps, bs == 2 ? 8 : 4) << "bs " << bs;
      HarnessConfig c = decode_config(32, 8, 16, kv_dtype);
      for (int i = 0; i < bs; ++i) c.requests.push_back({full ? len(rng) / 8 : len(rng), 1});
      check_cuda(c, bs == 2 ? "decode, wide split plan" : full ? "decode, unsplit plan" : "decode, narrow split plan");
    }
  }
}

// A full batch of long sequences runs unsplit, so each warp of a 4-warp block takes 33 to 90 tiles
// (the bench's B=64 L=4096 shape, which no other test reaches), most ending in a partial tile.
TEST_F(CudaAttention, DecodeLongUnsplitRanges) {
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  auto rng = rng_for_shapes();
  std::uniform_int_distribution<int> len(2113, 5800);
  const int bs = sms / 8 + 1;
  for (DType kv_dtype : {DType::bf16, DType::fp8_e4m3}) {
    for (int ps : {16, 64}) {
      const DecodePlan plan = choose_decode_plan(bs, 8, 2113, sms);
      EXPECT_EQ(plan.splits, 1);
      EXPECT_EQ(plan.warps, 4);
      HarnessConfig c = decode_config(32, 8, ps, kv_dtype);
      for (int i = 0; i < bs; ++i) c.requests.push_back({len(rng), 1});
      check_cuda(c, "decode, long unsplit ranges");
    }
  }
}

TEST_F(CudaAttention, Mqa) {
  auto rng = rng_for_shapes();
  for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::DECODE}) {
    for (int hq : {1, 8, 20}) {
      HarnessConfig c;
      c.mode = mode;
      c.requests = random_requests(rng, 3, 200, 90, mode);
      c.num_q_heads = hq;
      c.num_kv_heads = 1;
      check_cuda(c, "MQA");
    }
  }
}

TEST_F(CudaAttention, HeadDims) {
  auto rng = rng_for_shapes();
  for (int d : {64, 80, 96, 128, 256}) {
    for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::DECODE}) {
      HarnessConfig c;
      c.mode = mode;
      c.requests = random_requests(rng, 3, 150, 140, mode);
      c.head_dim = d;
      c.num_q_heads = 8;
      c.num_kv_heads = 2;
      c.page_size = 16;
      check_cuda(c, "head_dim");
    }
  }
}

TEST_F(CudaAttention, PageSize) {
  auto rng = rng_for_shapes();
  for (int ps : {1, 16, 64}) {
    for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::DECODE}) {
      HarnessConfig c;
      c.mode = mode;
      c.requests = random_requests(rng, 4, 300, 150, mode);
      c.page_size = ps;
      check_cuda(c, "page_size");
    }
  }
}

TEST_F(CudaAttention, ExtendWithPrefixAndNonCausal) {
  auto rng = rng_for_shapes();
  for (bool causal : {true, false}) {
    HarnessConfig c;
    c.requests = random_requests(rng, 4, 300, 200, ForwardMode::EXTEND);
    c.requests.push_back({0, 130});
    c.causal = causal;
    c.page_size = 16;
    check_cuda(c, causal ? "extend causal" : "NonCausal");
  }
}

// Long prefills: many query tiles per sequence and many K/V tiles per block (the wgmma kernel's
// stage ring wraps several times), both 16-bit types, both of its head dims, paged and unpaged.
TEST_F(CudaAttention, LongPrefillEveryWgmmaShape) {
  auto rng = rng_for_shapes();
  std::uniform_int_distribution<int> jitter(0, 97);
  for (int d : {64, 128}) {
    for (DType t : {DType::bf16, DType::f16}) {
      for (bool causal : {true, false}) {
        HarnessConfig c;
        c.requests = {{jitter(rng), 900 + jitter(rng)}, {600 + jitter(rng), 257 + jitter(rng)}, {0, 1 + jitter(rng)}};
        c.head_dim = d;
        c.num_q_heads = 4;
        c.num_kv_heads = 2;
        c.q_dtype = t;
        c.kv_dtype = t;
        c.causal = causal;
        c.page_size = causal ? 64 : 1;
        check_cuda(c, causal ? "long causal prefill" : "long non-causal prefill");
      }
    }
  }
}

// The wgmma prefill over pages smaller than, equal to and larger than its 128-key tiles (pages
// of 256: a tile inside one page), both head dims, shuffled pages, prefixes that start tiles
// mid-page, and a partial last tile.
TEST_F(CudaAttention, PagedPrefillEveryPageSize) {
  auto rng = rng_for_shapes();
  std::uniform_int_distribution<int> jitter(0, 97);
  for (int ps : {4, 8, 32, 128, 256}) {
    for (int d : {64, 128}) {
      HarnessConfig c;
      c.requests = {{jitter(rng), 700 + jitter(rng)}, {300 + jitter(rng), 260 + jitter(rng)}, {0, 128}};
      c.head_dim = d;
      c.num_q_heads = 4;
      c.num_kv_heads = 2;
      c.page_size = ps;
      c.causal = d == 128;
      const std::string what = "paged prefill, page_size " + std::to_string(ps);
      check_cuda(c, what.c_str());
    }
  }
}

TEST_F(CudaAttention, SlidingWindow) {
  auto rng = rng_for_shapes();
  for (int window : {0, 5, 64, 200}) {
    for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::DECODE}) {
      HarnessConfig c;
      c.mode = mode;
      c.requests = random_requests(rng, 3, 400, 150, mode);
      c.window_left = window;
      c.page_size = 16;
      check_cuda(c, "sliding window");
    }
  }
}

TEST_F(CudaAttention, LocalAttention) {
  auto rng = rng_for_shapes();
  for (auto [chunk, ps] : {std::pair{64, 16}, std::pair{128, 64}, std::pair{16, 1}}) {
    for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::DECODE}) {
      HarnessConfig c;
      c.mode = mode;
      c.requests = random_requests(rng, 3, 300, 150, mode);
      c.requests.push_back({290, mode == ForwardMode::DECODE ? 1 : 140});
      c.chunk_size = chunk;
      c.page_size = ps;
      check_cuda(c, "local attention");
    }
  }
}

TEST_F(CudaAttention, SoftCapSinksAndCustomScale) {
  auto rng = rng_for_shapes();
  for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::DECODE}) {
    HarnessConfig c;
    c.mode = mode;
    c.requests = random_requests(rng, 3, 200, 100, mode);
    c.logit_cap = 1.5f;
    c.scaling = 0.4f;
    check_cuda(c, "SoftCap");
    HarnessConfig s;
    s.mode = mode;
    s.requests = random_requests(rng, 3, 200, 100, mode);
    s.sinks = true;
    s.window_left = 32;
    s.scaling = 0.0371f;
    check_cuda(s, "Sinks");
  }
}

// One long request over few KV heads: more than 32 splits (the merge's second split per lane)
// and attention sinks joined after the splits are merged.
TEST_F(CudaAttention, DecodeManySplitsWithSinks) {
  std::mt19937 rng = rng_for_shapes();
  std::uniform_int_distribution<int> len(9000, 11000);
  HarnessConfig c = decode_config(6, 1, 16, DType::bf16);
  c.requests = {{len(rng), 1}, {len(rng), 1}};
  c.head_dim = 64;
  c.sinks = true;
  check_cuda(c, "decode many splits, sinks");
  EXPECT_GT(choose_decode_plan(2, 1, 9000, 132).splits, 32);
}

TEST_F(CudaAttention, TreeMask) {
  auto rng = rng_for_shapes();
  for (int draft : {1, 8, 33, 64}) {
    HarnessConfig c;
    c.mode = ForwardMode::TARGET_VERIFY;
    c.requests = random_requests(rng, 3, 300, 1, ForwardMode::DECODE);
    for (auto& r : c.requests) r.extend_len = draft;
    c.tree_mask = true;
    c.page_size = 16;
    check_cuda(c, "TreeMask");
  }
  // The tree kernel (prefix visible): decode-like rows over the prefix plus their tree tokens;
  // GQA and MHA, head_dim 64 and 128, page sizes 1 and 16, an empty prefix.
  for (int draft : {1, 8, 32}) {
    for (int head_dim : {64, 128}) {
      HarnessConfig c;
      c.mode = ForwardMode::TARGET_VERIFY;
      c.requests = random_requests(rng, 3, 300, 1, ForwardMode::DECODE);
      c.requests[0].prefix_len = draft == 8 ? 0 : c.requests[0].prefix_len;
      for (auto& r : c.requests) r.extend_len = draft;
      c.tree_mask = true;
      c.prefix_visible = true;
      c.head_dim = head_dim;
      c.v_head_dim = head_dim;
      c.num_kv_heads = head_dim == 64 ? c.num_q_heads : c.num_kv_heads;
      c.page_size = draft == 32 ? 1 : 16;
      check_cuda(c, "TreeMask, prefix visible");
    }
  }
  HarnessConfig empty;
  empty.mode = ForwardMode::TARGET_VERIFY;
  empty.requests = {{0, 3}, {21, 3}};
  empty.tree_mask = true;
  empty.hide_first_draft_row = true;
  check_cuda(empty, "tree mask with a row that sees nothing");
}

TEST_F(CudaAttention, MixedAndDraftExtend) {
  auto rng = rng_for_shapes();
  for (ForwardMode mode : {ForwardMode::MIXED, ForwardMode::DRAFT_EXTEND, ForwardMode::TARGET_VERIFY}) {
    HarnessConfig c;
    c.mode = mode;
    c.requests = random_requests(rng, 4, 100, 20, ForwardMode::EXTEND);
    if (mode == ForwardMode::TARGET_VERIFY) {
      for (auto& r : c.requests) r.extend_len = 4;
    } else {
      c.requests[1].extend_len = 1;
    }
    check_cuda(c, forward_mode_name(mode).data());
  }
}

TEST_F(CudaAttention, Fp8KvAndF16) {
  auto rng = rng_for_shapes();
  for (ForwardMode mode : {ForwardMode::EXTEND, ForwardMode::DECODE}) {
    HarnessConfig c;
    c.mode = mode;
    c.requests = random_requests(rng, 3, 300, 120, mode);
    c.kv_dtype = DType::fp8_e4m3;
    c.k_scale = 0.0213f;
    c.v_scale = 0.37f;
    c.page_size = 16;
    check_cuda(c, "Fp8Kv");
    HarnessConfig h;
    h.mode = mode;
    h.requests = random_requests(rng, 3, 300, 120, mode);
    h.q_dtype = DType::f16;
    h.kv_dtype = DType::f16;
    check_cuda(h, "f16");
  }
}

// Decode of every head_dim over caches that are converted on the way to the tensor cores (fp8
// with descales; a 16-bit cache of the other type than the query's), with one request long
// enough to be split and merged.
TEST_F(CudaAttention, DecodeConvertedCachesEveryHeadDim) {
  auto rng = rng_for_shapes();
  std::uniform_int_distribution<int> len(2000, 3000);
  for (int d : {64, 80, 96, 128, 256}) {
    for (auto [q_dtype, kv_dtype] : {std::pair{DType::bf16, DType::fp8_e4m3}, std::pair{DType::f16, DType::fp8_e4m3},
                                     std::pair{DType::bf16, DType::f16}}) {
      HarnessConfig c = decode_config(12, 2, 16, kv_dtype);
      c.requests = random_requests(rng, 2, 300, 1, ForwardMode::DECODE);
      c.requests.push_back({len(rng), 1});
      c.head_dim = d;
      c.q_dtype = q_dtype;
      check_cuda(c, "decode converted cache");
    }
  }
}

TEST_F(CudaAttention, PrefillBatchedEqualsPerRequestBitwise) {
  auto rng = rng_for_shapes();
  HarnessConfig c;
  c.requests = random_requests(rng, 4, 200, 150, ForwardMode::EXTEND);
  c.q_dtype = DType::bf16;
  c.kv_dtype = DType::bf16;
  c.page_size = 16;
  AttentionHarness h(c, fresh_seed());
  AttentionBackendOptions o = h.backend_options();
  o.device = Device::cuda(0);
  CudaAttentionBackend backend(o);
  const AttentionResult batched = h.run_on_device(backend, o.device);
  size_t offset = 0;
  for (int r = 0; r < static_cast<int>(c.requests.size()); ++r) {
    const AttentionResult alone = h.run_on_device(backend, o.device, {r});
    for (size_t i = 0; i < alone.out.size(); ++i) ASSERT_EQ(alone.out[i], batched.out[offset + i]) << "request " << r;
    offset += alone.out.size();
  }
}

TEST_F(CudaAttention, KvWriteMatchesHostBitForBit) {
  for (DType dtype : {DType::bf16, DType::f16, DType::fp8_e4m3}) {
    const KVPoolConfig host_cfg{64, 1, 2, 64, 64, dtype, Device::cpu()};
    KVPoolConfig dev_cfg = host_cfg;
    dev_cfg.device = Device::cuda(0);
    MHAKVPool host(host_cfg), dev(dev_cfg);
    host.set_kv_scales(0, 0.37f, 0.0213f);
    dev.set_kv_scales(0, 0.37f, 0.0213f);
    std::mt19937 rng(static_cast<uint32_t>(fresh_seed()));
    std::normal_distribution<float> dist(0.0f, 3.0f);
    const int n = 9;
    Buffer k(DType::f32, {n, 2, 64}), v(DType::f32, {n, 2, 64});
    for (int i = 0; i < k.numel(); ++i) {
      k.data_as<float>()[i] = dist(rng);
      v.data_as<float>()[i] = dist(rng) * 40.0f;  // some saturate in fp8
    }
    std::vector<int32_t> loc{3, 60, 7, 8, 9, 33, 34, 12, 50};
    host.set_kv_buffer(0, loc, k, v);
    // The backend's write path, through a one-layer decode-free extend.
    Buffer dk(DType::f32, k.shape(), Device::cuda(0)), dv(DType::f32, v.shape(), Device::cuda(0));
    Buffer dloc(DType::i32, {n}, Device::cuda(0));
    copy(dk, k);
    copy(dv, v);
    copy(dloc, TensorView(loc.data(), DType::i32, {n}));
    dev.set_kv_buffer(0, dloc, dk, dv, nullptr);
    for (auto [hb, db] : {std::pair{host.k_buffer(0), dev.k_buffer(0)}, std::pair{host.v_buffer(0), dev.v_buffer(0)}}) {
      Buffer back(db.dtype(), db.shape());
      copy(back, db);
      ASSERT_EQ(std::memcmp(back.data(), hb.data(), hb.nbytes()), 0) << dtype_name(dtype);
    }
  }
}

TEST_F(CudaAttention, MergeStateMatchesCpu) {
  std::mt19937 rng(static_cast<uint32_t>(fresh_seed()));
  std::normal_distribution<float> dist(0.0f, 2.0f);
  const int n = 37, h = 5, d = 128;
  Buffer va(DType::bf16, {n, h, d}), vb(DType::bf16, {n, h, d}), sa(DType::f32, {n, h}), sb(DType::f32, {n, h});
  for (int i = 0; i < va.numel(); ++i) {
    store_from_float(va.data(), DType::bf16, static_cast<size_t>(i), dist(rng));
    store_from_float(vb.data(), DType::bf16, static_cast<size_t>(i), dist(rng));
  }
  for (int i = 0; i < n * h; ++i) {
    sa.data_as<float>()[i] = i % 7 == 0 ? -INFINITY : dist(rng);
    sb.data_as<float>()[i] = i % 11 == 0 ? -INFINITY : dist(rng);
  }
  Buffer vo(DType::bf16, {n, h, d}), so(DType::f32, {n, h});
  merge_state(va, sa, vb, sb, vo, so);
  auto up = [](const Buffer& b) {
    Buffer d(b.dtype(), b.shape(), Device::cuda(0));
    copy(d, b);
    return d;
  };
  Buffer dva = up(va), dvb = up(vb), dsa = up(sa), dsb = up(sb);
  Buffer dvo(DType::bf16, {n, h, d}, Device::cuda(0)), dso(DType::f32, {n, h}, Device::cuda(0));
  merge_state(dva, dsa, dvb, dsb, dvo, dso);
  Buffer gvo(DType::bf16, {n, h, d}), gso(DType::f32, {n, h});
  copy(gvo, dvo);
  copy(gso, dso);
  for (int i = 0; i < n * h; ++i) {
    const float want = so.data_as<float>()[i], got = gso.data_as<float>()[i];
    if (std::isinf(want)) {
      EXPECT_EQ(got, want);
    } else {
      EXPECT_NEAR(got, want, 1e-5f);
    }
  }
  for (int64_t i = 0; i < vo.numel(); ++i) {
    const float want = load_as_float(vo.data(), DType::bf16, static_cast<size_t>(i));
    const float got = load_as_float(gvo.data(), DType::bf16, static_cast<size_t>(i));
    ASSERT_NEAR(got, want, std::fabs(want) * 8e-3f + 1e-6f) << i;
  }
}

// Capture one decode step in a CUDA graph, replay it with other lengths and contents, and match
// the eager results.
TEST_F(CudaAttention, CudaGraphReplayMatchesEager) {
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int bs = 4, hq = 32, hk = 8, d = 128, max_context = 4096, ps = 16;
  AttentionBackendOptions o;
  o.device = Device::cuda(0);
  o.page_size = ps;
  o.cuda_stream = stream;
  o.max_context_len = max_context;
  CudaAttentionBackend graph_backend(o);
  CudaAttentionBackend eager_backend(o);
  AttentionLayer layer;
  layer.num_q_heads = hq;
  layer.num_kv_heads = hk;
  layer.head_dim = d;
  graph_backend.check_layer(layer, DType::bf16, DType::bf16);
  eager_backend.check_layer(layer, DType::bf16, DType::bf16);
  graph_backend.init_cuda_graph_state(bs, bs);

  const int64_t pages = bs * (max_context / ps) + 1;
  MHAKVPool pool(KVPoolConfig{pages * ps, 1, hk, d, d, DType::bf16, o.device});
  ReqToTokenPool req_pool(bs, max_context);
  std::mt19937 rng(static_cast<uint32_t>(fresh_seed()));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  {
    std::vector<float> host(static_cast<size_t>(pool.k_buffer(0).numel()));
    Buffer tmp(DType::bf16, pool.k_buffer(0).shape());
    for (float& x : host) x = dist(rng);
    convert_from_float(host.data(), tmp.data(), DType::bf16, host.size());
    copy(pool.k_buffer(0), tmp);
    for (float& x : host) x = dist(rng);
    convert_from_float(host.data(), tmp.data(), DType::bf16, host.size());
    copy(pool.v_buffer(0), tmp);
  }
  Buffer q(DType::bf16, {bs, hq, d}, o.device), out_graph(DType::bf16, {bs, hq, d}, o.device);
  Buffer out_eager(DType::bf16, {bs, hq, d}, o.device);
  Buffer qh(DType::bf16, {bs, hq, d});

  auto make_batch = [&](const std::vector<int32_t>& lens) {
    ForwardBatch b;
    b.forward_mode = ForwardMode::DECODE;
    b.batch_size = bs;
    b.req_to_token_pool = &req_pool;
    b.token_to_kv_pool = &pool;
    std::vector<int32_t> page_order(static_cast<size_t>(pages - 1));
    for (size_t i = 0; i < page_order.size(); ++i) page_order[i] = static_cast<int32_t>(i + 1);
    std::shuffle(page_order.begin(), page_order.end(), rng);
    for (int r = 0; r < bs; ++r) {
      std::vector<int32_t> tokens(static_cast<size_t>(lens[static_cast<size_t>(r)]));
      for (int t = 0; t < lens[static_cast<size_t>(r)]; ++t) {
        tokens[static_cast<size_t>(t)] = page_order[static_cast<size_t>(r * (max_context / ps) + t / ps)] * ps + t % ps;
      }
      req_pool.write(r, 0, tokens);
      b.req_pool_indices.push_back(r);
      b.seq_lens.push_back(lens[static_cast<size_t>(r)]);
      b.out_cache_loc.push_back(tokens.back());
    }
    return b;
  };
  auto fresh_q = [&] {
    std::vector<float> host(static_cast<size_t>(qh.numel()));
    for (float& x : host) x = dist(rng);
    convert_from_float(host.data(), qh.data(), DType::bf16, host.size());
    copy(q, qh);
  };
  ForwardOptions no_write;
  no_write.save_kv_cache = false;

  ForwardBatch capture_batch = make_batch({100, 2000, 7, 4096});
  fresh_q();
  graph_backend.init_forward_metadata_capture_cuda_graph(capture_batch);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  graph_backend.forward(q, {}, {}, out_graph, layer, capture_batch, no_write);
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  for (const auto& lens : {std::vector<int32_t>{1, 1, 1, 1}, std::vector<int32_t>{3000, 17, 4096, 256},
                           std::vector<int32_t>{100, 2000, 7, 4096}}) {
    ForwardBatch b = make_batch(lens);
    fresh_q();
    graph_backend.init_forward_metadata_replay_cuda_graph(b);
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    eager_backend.init_forward_metadata(b);
    eager_backend.forward(q, {}, {}, out_eager, layer, b, no_write);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    Buffer g(DType::bf16, out_graph.shape()), e(DType::bf16, out_eager.shape());
    copy(g, out_graph);
    copy(e, out_eager);
    double max_diff = 0;
    for (int64_t i = 0; i < g.numel(); ++i) {
      const double a = load_as_float(g.data(), DType::bf16, static_cast<size_t>(i));
      const double c = load_as_float(e.data(), DType::bf16, static_cast<size_t>(i));
      ASSERT_TRUE(std::isfinite(a)) << i;
      max_diff = std::max(max_diff, std::fabs(a - c));
    }
    // Same kernels and inputs; the split count may differ (graphs plan for max_context_len).
    EXPECT_LT(max_diff, 2e-2) << "lens " << lens[0] << "," << lens[1] << "," << lens[2] << "," << lens[3];
  }
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaStreamDestroy(stream));
}

// The prefill grid's order: every (item, head) once; a group's heads are consecutive, its blocks
// contiguous, and its items run last to first with the heads fastest.
TEST(CudaPrefillOrder, GroupsOfHeadsCoverTheGridHeaviestFirst) {
  std::mt19937 rng = rng_for_shapes();
  for (int trial = 0; trial < 200; ++trial) {
    const int num_items = std::uniform_int_distribution<int>(1, 40)(rng);
    const int num_heads = std::uniform_int_distribution<int>(1, 130)(rng);
    const int group = std::uniform_int_distribution<int>(0, num_heads + 3)(rng);
    SCOPED_TRACE(::testing::Message() << num_items << " items, " << num_heads << " heads, groups of " << group);
    const int g = group > 0 && group < num_heads ? group : num_heads;
    std::set<std::pair<int, int>> seen;
    for (int b = 0; b < num_items * num_heads; ++b) {
      int item = -1;
      int head = -1;
      ck::prefill_block_work(b, num_items, num_heads, group, item, head);
      ASSERT_TRUE(item >= 0 && item < num_items && head >= 0 && head < num_heads) << "block " << b;
      ASSERT_TRUE(seen.insert({item, head}).second) << "block " << b << " repeats (" << item << ", " << head << ")";
      const int first = head / g * g;
      const int heads = std::min(g, num_heads - first);
      const int in_group = b - first * num_items;
      EXPECT_EQ(item, num_items - 1 - in_group / heads) << "block " << b;
      EXPECT_EQ(head, first + in_group % heads) << "block " << b;
    }
  }
}

TEST(CudaPrefillOrder, HeadGroupsKeepTheirKvWithinHalfTheL2) {
  const int64_t l2 = 50 << 20;
  // Every head's K/V fits the L2: one group.
  EXPECT_EQ(ck::prefill_head_group(6 << 20, 32, 8, l2), 32);
  EXPECT_EQ(ck::prefill_head_group(int64_t{3} << 20, 16, 16, l2), 16);
  EXPECT_EQ(ck::prefill_head_group(0, 32, 8, l2), 32);
  // 8 MiB per KV head: three KV heads fit 25 MiB, times four query heads each.
  EXPECT_EQ(ck::prefill_head_group(8 << 20, 32, 8, l2), 12);
  EXPECT_EQ(ck::prefill_head_group(4 << 20, 128, 128, l2), 6);
  // One KV head alone is too large: one GQA group.
  EXPECT_EQ(ck::prefill_head_group(int64_t{1} << 30, 32, 8, l2), 4);
}

TEST(CudaAttentionErrors, UnsupportedIsClearAtCheck) {
  AttentionLayer layer;
  layer.num_q_heads = 8;
  layer.num_kv_heads = 2;
  layer.head_dim = 72;
  CudaAttentionShape shape;
  shape.page_size = 16;
  for (const auto& select : {select_cuda_decode, select_cuda_extend, select_cuda_verify, select_cuda_draft_tree}) {
    const CudaAttentionPlan plan = select(layer, DType::bf16, DType::bf16, shape);
    EXPECT_EQ(plan.kernel, CudaAttentionKernel::kNone);
    EXPECT_NE(plan.unsupported_reason.find("head_dim 72 is not supported; supported: 64, 80, 96, 128, 256"),
              std::string::npos);
  }
  layer.head_dim = 128;
  EXPECT_NE(select_cuda_extend(layer, DType::f32, DType::bf16, shape).unsupported_reason.find("query dtype f32"),
            std::string::npos);
  shape.page_size = 64;
  EXPECT_TRUE(select_cuda_extend(layer, DType::bf16, DType::fp8_e4m3, shape).supported());
  shape.page_size = 24;
  EXPECT_NE(select_cuda_decode(layer, DType::bf16, DType::bf16, shape).unsupported_reason.find("page_size 24"),
            std::string::npos);
  shape.page_size = 16;
  layer.use_local_attention = true;
  EXPECT_NE(select_cuda_decode(layer, DType::bf16, DType::bf16, shape).unsupported_reason.find("attention_chunk_size"),
            std::string::npos);
  shape.attention_chunk_size = 64;
  EXPECT_TRUE(select_cuda_decode(layer, DType::bf16, DType::bf16, shape).supported());
  shape.custom_mask = true;
  EXPECT_NE(select_cuda_extend(layer, DType::bf16, DType::bf16, shape).unsupported_reason.find("local attention with a "
                                                                                               "tree mask"),
            std::string::npos);
}

// Extend-like steps: warpgroup MMA for a cache of the query's type at head_dim 64 / 128, mma.sync
// otherwise; the wgmma head groups from the step's K/V bytes.
TEST(CudaAttentionSelection, ExtendPicksWgmmaWhereItIsBuilt) {
  AttentionLayer layer;
  layer.num_q_heads = 32;
  layer.num_kv_heads = 8;
  CudaAttentionShape shape;
  shape.page_size = 16;
  shape.kv_rows = 300000;
  shape.l2_bytes = 50 << 20;
  for (int d : {64, 80, 96, 128, 256}) {
    layer.head_dim = d;
    for (DType q : {DType::bf16, DType::f16}) {
      for (DType kv : {DType::bf16, DType::f16, DType::fp8_e4m3}) {
        const CudaAttentionPlan plan = select_cuda_extend(layer, q, kv, shape);
        ASSERT_TRUE(plan.supported()) << plan.unsupported_reason;
        const bool wgmma = q == kv && (d == 64 || d == 128);
        EXPECT_EQ(plan.kernel, wgmma ? CudaAttentionKernel::kPrefillWgmma : CudaAttentionKernel::kPrefillMma)
            << "head_dim " << d << " q " << dtype_name(q) << " kv " << dtype_name(kv);
        // The kernel the selection names is one its launch accepts.
        ck::AttentionParams p{};
        p.io_dtype = kernel_dtype_code(q);
        p.kv_dtype = kernel_dtype_code(kv);
        p.head_dim = d;
        p.v_head_dim = d;
        EXPECT_EQ(ck::prefill_wgmma_supports(p), wgmma);
        EXPECT_EQ(plan.heads_per_group,
                  ck::prefill_head_group(shape.kv_rows * 2 * d * static_cast<int64_t>(dtype_size(kv)), 32, 8,
                                         shape.l2_bytes));
      }
    }
  }
}

// Decode: the split heuristic's plan (for max_context_len when deterministic) and the workspace
// its splits need.
TEST(CudaAttentionSelection, DecodePlanAndWorkspace) {
  AttentionLayer layer;
  layer.num_q_heads = 12;
  layer.num_kv_heads = 2;
  layer.head_dim = 128;
  CudaAttentionShape shape;
  shape.page_size = 16;
  shape.num_sms = 132;
  shape.batch_size = 3;
  shape.num_tokens = 3;
  shape.max_kv_len = 5000;
  shape.max_context_len = 32768;
  CudaAttentionPlan plan = select_cuda_decode(layer, DType::bf16, DType::fp8_e4m3, shape);
  EXPECT_EQ(plan.kernel, CudaAttentionKernel::kDecode);
  const DecodePlan want = choose_decode_plan(3, 2, 5000, 132);
  ASSERT_GT(want.splits, 1);
  EXPECT_EQ(plan.decode.splits, want.splits);
  EXPECT_EQ(plan.decode.warps, want.warps);
  EXPECT_EQ(plan.workspace.partial_rows, int64_t{want.splits} * 3 * 12);
  EXPECT_EQ(plan.workspace.partial_values, int64_t{want.splits} * 3 * 12 * 128);
  EXPECT_EQ(plan.workspace.counters, 3 * 12);
  shape.deterministic = true;
  plan = select_cuda_decode(layer, DType::bf16, DType::bf16, shape);
  EXPECT_EQ(plan.decode.splits, choose_decode_plan(1, 2, 32768, 132).splits);
  shape.deterministic = false;
  shape.batch_size = 200;  // fills the GPU: no split, no workspace
  shape.num_tokens = 200;
  plan = select_cuda_decode(layer, DType::bf16, DType::bf16, shape);
  EXPECT_EQ(plan.decode.splits, 1);
  EXPECT_EQ(plan.workspace.partial_rows, 0);
  EXPECT_EQ(plan.workspace.counters, 0);
}

// Verify: the tree kernel where the step staged it and it serves the layer; else the prefill
// kernels over the mask, or a refusal naming why when no mask was staged.
TEST(CudaAttentionSelection, VerifyTreeKernelOrPrefillFallback) {
  AttentionLayer layer;
  layer.num_q_heads = 8;
  layer.num_kv_heads = 2;
  layer.head_dim = 128;
  CudaAttentionShape shape;
  shape.page_size = 16;
  shape.tree_staged = true;
  EXPECT_EQ(select_cuda_verify(layer, DType::bf16, DType::bf16, shape).kernel, CudaAttentionKernel::kTree);
  EXPECT_EQ(select_cuda_draft_tree(layer, DType::bf16, DType::bf16, shape).kernel, CudaAttentionKernel::kTree);
  shape.rows_contiguous = false;
  CudaAttentionPlan plan = select_cuda_verify(layer, DType::bf16, DType::bf16, shape);
  EXPECT_FALSE(plan.supported());
  EXPECT_NE(plan.unsupported_reason.find("planned for the tree kernel"), std::string::npos);
  EXPECT_NE(plan.unsupported_reason.find("dense [rows, num_q_heads, head_dim]"), std::string::npos);
  shape.custom_mask = true;
  EXPECT_EQ(select_cuda_verify(layer, DType::bf16, DType::bf16, shape).kernel, CudaAttentionKernel::kPrefillWgmma);
  shape.rows_contiguous = true;
  layer.sliding_window_size = 64;
  EXPECT_EQ(select_cuda_verify(layer, DType::bf16, DType::bf16, shape).kernel, CudaAttentionKernel::kPrefillWgmma);
  EXPECT_NE(select_cuda_draft_tree(layer, DType::bf16, DType::bf16, shape).unsupported_reason.find(
                "sliding_window_size 64"),
            std::string::npos);
  layer.sliding_window_size = -1;
  // The tree kernel reads an fp8 cache too; a f16 cache goes to the prefill kernels.
  EXPECT_EQ(select_cuda_verify(layer, DType::bf16, DType::fp8_e4m3, shape).kernel, CudaAttentionKernel::kTree);
  EXPECT_EQ(select_cuda_verify(layer, DType::bf16, DType::f16, shape).kernel, CudaAttentionKernel::kPrefillMma);
  shape.tree_staged = false;
  EXPECT_EQ(select_cuda_verify(layer, DType::bf16, DType::bf16, shape).kernel, CudaAttentionKernel::kPrefillWgmma);
}

}  // namespace
}  // namespace specula::testing
