// The linear-attention state pool (model/la_state.hpp LaPool) on the CPU backend: slots are
// zeroed, the lowest free one is reused, growth keeps every slot's contents (and moves the base),
// clones copy into a new slot, the memory goes when the last state does; a layer's mixer refuses a
// state of another layer's pool.
#include <catch2/catch.hpp>

#include <fstream>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/checkpoint.hpp"
#include "model/model.hpp"
#include "ops/linear_attn.hpp"
#include "model/la_state.hpp"

using namespace dz;

namespace {
void fill(Backend& be, const DTensor& t, float v0) {
  std::vector<float> h(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < h.size(); ++i) h[i] = v0 + float(i);
  const DTensor u = be.upload(h.data(), t.shape, t.dtype);
  be.copy_rows(u.reshaped({1, u.numel()}), 0, t.reshaped({1, t.numel()}), 0, 1);
}
}  // namespace

TEST_CASE("la pool: slots zeroed and reused lowest first, growth keeps contents, clone copies, empty frees", "[unit]") {
  Backend& be = cpu_backend();
  auto pool = std::make_shared<LaPool>(be, Shape{2, 3, 4}, Shape{3, 5}, DType::F32);
  CHECK(pool->capacity() == 0);
  auto a = std::make_unique<LaState>(pool);
  CHECK(a->slot == 0);
  CHECK(pool->capacity() == 1);
  fill(be, a->S(), 1.f);
  fill(be, a->conv(), 100.f);
  const std::vector<float> sa = be.to_host(a->S()), ca = be.to_host(a->conv());
  const void* base1 = pool->states().data;
  auto b = std::make_unique<LaState>(pool);  // grows to 2: a's contents copied
  auto c = std::make_unique<LaState>(pool);  // grows to 4
  CHECK(b->slot == 1);
  CHECK(c->slot == 2);
  CHECK(pool->capacity() == 4);
  CHECK(pool->states().data != base1);
  CHECK(be.to_host(a->S()) == sa);
  CHECK(be.to_host(a->conv()) == ca);
  for (float v : be.to_host(c->S())) CHECK(v == 0.f);
  for (float v : be.to_host(c->conv())) CHECK(v == 0.f);
  b.reset();
  auto d = a->clone();  // takes the freed slot 1, copies a
  auto* dl = dynamic_cast<LaState*>(d.get());
  REQUIRE(dl);
  CHECK(dl->slot == 1);
  CHECK(be.to_host(dl->S()) == sa);
  CHECK(be.to_host(dl->conv()) == ca);
  CHECK(pool->live() == 3);
  const std::vector<const void*> key = a->device_buffers();
  CHECK(key.size() == 3);
  CHECK(key[0] == pool->states().data);
  a.reset();
  c.reset();
  d.reset();
  CHECK(pool->live() == 0);
  CHECK(pool->capacity() == 0);
  CHECK_FALSE(pool->states().defined());
  CHECK_THROWS_WITH(pool->release(0), Catch::Contains("not in use"));
}

TEST_CASE("la pool: each layer's mixer has its own pool and refuses another layer's state", "[unit]") {
  std::ifstream f(std::string(DZ_SOURCE_DIR) + "/tests/golden/kimi_linear/config.json");
  REQUIRE(f.good());
  const ModelConfig cfg = ModelConfig::from_json(nlohmann::json::parse(f));
  auto ck = Checkpoint::random(3);
  auto m = Model::build(cfg, *ck);
  auto s1 = m->make_state(), s2 = m->make_state();
  int la = -1, la2 = -1;
  for (size_t l = 0; l < s1.mixers.size(); ++l)
    if (dynamic_cast<LaState*>(s1.mixers[l].get())) (la < 0 ? la : la2) = int(l);
  REQUIRE(la >= 0);
  REQUIRE(la2 >= 0);  // the golden kimi_linear has linear attention at layers 0 and 2
  auto* a = dynamic_cast<LaState*>(s1.mixers[size_t(la)].get());
  auto* b = dynamic_cast<LaState*>(s2.mixers[size_t(la)].get());
  CHECK(a->pool == b->pool);  // one pool per layer, shared by the documents
  CHECK(a->slot != b->slot);
  CHECK(dynamic_cast<LaState*>(s1.mixers[size_t(la2)].get())->pool != a->pool);
  std::swap(s1.mixers[size_t(la)], s1.mixers[size_t(la2)]);  // layer la now holds layer la2's state
  const int32_t tok = 3;
  CHECK_THROWS_WITH(m->forward(&tok, 1, s1), Catch::Contains("own pool"));
}
