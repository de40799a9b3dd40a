// The runtime's chunk stages (kernels/moe_runtime.h make_stages / acquire_stage /
// run_staged_chunk), as verify --device cuda uses them: chunks staged into pinned slots by another
// thread, ahead of their turn, give the same MoE outputs bit for bit as the same chunks uploaded
// by the driving thread (begin_chunk + upload); a slot is reused only once its chunk's kernels
// finished (more chunks than slots, filled while earlier chunks compute); a stage destroyed unrun
// goes back to the pool; misuse is kInternal. Skips without a device.
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <thread>

#include "formats/codec.h"
#include "formats/moe_reader.h"
#include "kernels/moe_runtime.h"
#include "kernels/moepack_cuda.h"
#include "tests/test_util.h"
#include "verify/moe_reference.h"
#include "verify/router.h"

namespace moepack {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!cuda_device_info().available) GTEST_SKIP() << "no CUDA device (or built without CUDA)"

// One Marlin layer from GPTQ int4 g128: the packed parameters and their decoding.
struct StagedLayer {
  const TargetLayout* row = nullptr;
  LayoutOptions o;
  int64_t E = 16, H = 256, I = 256;
  TensorMap packed;
};

StagedLayer marlin_layer(test::Rng& rng) {
  StagedLayer l;
  l.row = find_target_layout("marlin");
  QuantParams p;
  p.method = QuantMethod::kGptq;
  p.bits = 4;
  p.group_size = 128;
  const MoeShape s = moe_shape_for(p, l.E, l.H, l.I, true);
  l.o.act_dtype = DType::kBF16;
  l.o.gated = true;
  l.o.source_method = p.method;
  l.o.prefix = "model.layers.0.mlp.experts.";
  l.o.hidden = l.H;
  l.o.inter = l.I;
  test::RandomTensorOptions ro;
  ro.zero_lo = ro.zero_hi = 8;  // symmetric GPTQ
  const MoeExperts x = test::random_moe_experts(rng, s, ro);
  for (Tensor& t : l.row->pack(l.o, x)) l.packed.emplace(t.name, std::move(t));
  return l;
}

// Experts [e0, e1) of every packed parameter.
TensorMap chunk_of(const StagedLayer& l, int64_t e0, int64_t e1) {
  TensorMap part;
  for (const auto& [name, t] : l.packed) {
    Tensor c = t;
    c.shape[0] = e1 - e0;
    const size_t per = t.data.size() / static_cast<size_t>(l.E);
    c.data.assign(t.data.begin() + static_cast<int64_t>(per * static_cast<size_t>(e0)),
                  t.data.begin() + static_cast<int64_t>(per * static_cast<size_t>(e1)));
    part.emplace(name, std::move(c));
  }
  return part;
}

struct Readers {
  reader::ProjReader w13, w2, ref13, ref2;
};

// A chunk's readers through `upload` / `nibbles` (the reference's codes packed two per byte).
template <class Up, class Nib>
Readers readers_of(const StagedLayer& l, const TensorMap& part, const MoeExperts& dec, Up upload,
                   Nib nibbles) {
  const ParamLocator locate = [&](const std::string&, const Tensor& t) {
    return upload(t.data.data(), t.data.size());
  };
  const BufferLocator buffer = [&](const void* p, size_t n) { return upload(p, n); };
  const auto packed = [&](const QuantTensor& q) -> NibbleLocator {
    const bool signed_codes = q.kind == CodeKind::kInt;
    return [&nibbles, signed_codes](const uint8_t* c, size_t n) {
      return nibbles(c, n, signed_codes);
    };
  };
  Readers r;
  r.w13 = l.row->make_reader(l.o, part, MoeProj::kW13, locate);
  r.w2 = l.row->make_reader(l.o, part, MoeProj::kW2, locate);
  r.ref13 = make_reference_reader(r.w13, dec.w13, buffer, packed(dec.w13));
  r.ref2 = make_reference_reader(r.w2, dec.w2, buffer, packed(dec.w2));
  return r;
}

MoeDeviceRouting begin(MoeRuntime& rt, const StagedLayer& l, const std::vector<float>& x,
                       const std::vector<float>& rw, int64_t T) {
  ref::RouterConfig router;
  router.num_experts = l.E;
  router.top_k = 4;
  router.renormalize = true;
  MoeLayerSpec layer;
  layer.experts = l.E;
  layer.hidden = l.H;
  layer.inter = l.I;
  layer.gated = true;
  return rt.begin_layer(layer, ref::runtime_router_spec(router), x.data(), T, rw.data(), nullptr,
                        nullptr);
}

bool bits_equal(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

TEST(MoeStageCuda, ChunksStagedOnOtherThreadsEqualChunksUploadedByTheLoop) {
  SKIP_WITHOUT_CUDA();
  test::Rng rng(2711);
  const StagedLayer l = marlin_layer(rng);
  ASSERT_NE(l.row, nullptr);
  const int64_t T = 64, per_chunk = 2, chunks = l.E / per_chunk;
  const std::vector<float> x = ref::random_hidden_states(T, l.H, 5);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> rw(static_cast<size_t>(l.E * l.H));
  for (float& f : rw) f = nd(rng);
  std::vector<TensorMap> parts;
  std::vector<MoeExperts> decoded;
  for (int64_t c = 0; c < chunks; ++c) {
    parts.push_back(chunk_of(l, c * per_chunk, (c + 1) * per_chunk));
    decoded.push_back(l.row->unpack(l.o, parts.back()));
  }

  // The driving thread uploads each chunk (two alternating staging areas).
  MoeRuntime rt;
  begin(rt, l, x, rw, T);
  for (int64_t c = 0; c < chunks; ++c) {
    rt.begin_chunk();
    const Readers r = readers_of(
        l, parts[c], decoded[c], [&](const void* p, size_t n) { return rt.upload(p, n); },
        [&](const uint8_t* p, size_t n, bool s) { return rt.upload_nibbles(p, n, s); });
    rt.run_chunk(c * per_chunk, (c + 1) * per_chunk, r.w13, r.w2, r.ref13, r.ref2);
  }
  const MoeLayerOutputs want = rt.finish_layer();

  // A thread of its own fills the chunks' stages in order, ahead of their turn: three slots for
  // eight chunks, so every slot is reused, each time once its previous chunk's kernels finished.
  // (In order, one filler: it never holds a slot the loop needs before it, as verify's window.)
  MoeRuntime staged;
  staged.make_stages(3);
  begin(staged, l, x, rw, T);
  struct Filled {
    MoeChunkStage stage;
    Readers readers;
  };
  std::vector<std::promise<Filled>> ready(static_cast<size_t>(chunks));
  auto fill = [&] {
    for (int64_t c = 0; c < chunks; ++c) {
      try {
        Filled f;
        f.stage = staged.acquire_stage();
        MoeChunkStage& st = f.stage;
        f.readers = readers_of(
            l, parts[c], decoded[c], [&](const void* p, size_t n) { return st.upload(p, n); },
            [&](const uint8_t* p, size_t n, bool s) { return st.upload_nibbles(p, n, s); });
        ready[static_cast<size_t>(c)].set_value(std::move(f));
      } catch (...) {
        ready[static_cast<size_t>(c)].set_exception(std::current_exception());
      }
    }
  };
  std::thread filler(fill);
  // Every chunk taken (a failure drops its stage, so the filler never waits forever).
  for (int64_t c = 0; c < chunks; ++c) {
    try {
      Filled f = ready[static_cast<size_t>(c)].get_future().get();
      EXPECT_FALSE(f.stage.empty());
      staged.run_staged_chunk(f.stage, c * per_chunk, (c + 1) * per_chunk, f.readers.w13,
                              f.readers.w2, f.readers.ref13, f.readers.ref2);
      EXPECT_TRUE(f.stage.empty()) << "run_staged_chunk gives the slot back";
    } catch (const std::exception& e) {
      ADD_FAILURE() << "chunk " << c << ": " << e.what();
    }
  }
  filler.join();
  const MoeLayerOutputs got = staged.finish_layer();
  EXPECT_TRUE(bits_equal(got.got_out, want.got_out));
  EXPECT_TRUE(bits_equal(got.got_slots, want.got_slots));
  EXPECT_TRUE(bits_equal(got.ref_out, want.ref_out));
  EXPECT_TRUE(bits_equal(got.ref_slots, want.ref_slots));
  double norm = 0;
  for (double v : want.ref_out) norm += v * v;
  EXPECT_GT(norm, 0.0) << "an all-zero output proves nothing";
  EXPECT_EQ(staged.uploaded_bytes(), rt.uploaded_bytes());
}

TEST(MoeStageCuda, AStageDroppedUnrunGoesBackAndMisuseIsInternal) {
  SKIP_WITHOUT_CUDA();
  MoeRuntime rt;
  test::expect_error([&] { rt.acquire_stage(); }, ErrorCode::kInternal);
  rt.make_stages(2);
  test::expect_error([&] { rt.make_stages(2); }, ErrorCode::kInternal);
  {
    MoeChunkStage a = rt.acquire_stage();
    MoeChunkStage b = rt.acquire_stage();
    const uint8_t bytes[3] = {1, 2, 3};
    EXPECT_NE(a.upload(bytes, sizeof(bytes)), nullptr);
    MoeChunkStage moved = std::move(b);
    EXPECT_TRUE(b.empty());
    EXPECT_FALSE(moved.empty());
  }  // both dropped unrun: back in the pool
  MoeChunkStage again = rt.acquire_stage();
  MoeChunkStage second = rt.acquire_stage();  // would wait forever if a slot were lost
  EXPECT_FALSE(again.empty());
  EXPECT_FALSE(second.empty());
  MoeChunkStage empty;
  test::expect_error([&] { empty.upload("x", 1); }, ErrorCode::kInternal);
  const reader::ProjReader none{};
  test::expect_error([&] { rt.run_staged_chunk(empty, 0, 1, none, none, none, none); },
                     ErrorCode::kInternal);
}

}  // namespace
}  // namespace moepack
