// FlatBuckets on a CUDA device whose memory cap leaves no room for the model twice: the
// parameters go through one page-locked host buffer into the flat buffer (parked()), keep their
// values and become views of it, padding zero; and with room, they do not go through the host.
// Its own binary: the cap (launch::apply_memory_cap) lasts for the process.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <ciuic/kit/flat_buckets.h>
#include <ciuic/sharding.h>

#include "launch/launch.h"

namespace {

std::vector<ciuic::ShardingParam> make_params(int64_t scale) {
  std::vector<ciuic::ShardingParam> ps;
  at::manual_seed(11);
  const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  for (int64_t n : {int64_t{3} * scale + 5, int64_t{7}, int64_t{2} * scale, scale + 999})
    ps.push_back(
        {"p" + std::to_string(ps.size()), at::randn({n}, opts).requires_grad_(true), true});
  return ps;
}

void expect_views_with_values(ciuic::kit::FlatBuckets& fb,
                              const std::vector<ciuic::ShardingParam>& params,
                              const std::vector<at::Tensor>& want) {
  const at::Tensor& flat = fb.flat();
  ASSERT_TRUE(flat.is_cuda());
  const auto* lo = static_cast<const char*>(flat.data_ptr());
  const auto* hi = lo + flat.nbytes();
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i].tensor;
    EXPECT_TRUE(p.is_cuda()) << i;
    const auto* at_ = static_cast<const char*>(p.data_ptr());
    EXPECT_TRUE(at_ >= lo && at_ + p.nbytes() <= hi)
        << "parameter " << i << " is not a view of the flat buffer";
    EXPECT_TRUE(at::equal(p.detach().cpu(), want[i])) << i;
  }
  // Padding zero (checked on the host: the device is capped).
  const at::Tensor host = flat.cpu();
  at::Tensor used = at::zeros({host.numel()}, at::kBool);
  for (const auto& b : fb.buckets())
    for (const auto& m : b.members) used.narrow(0, b.offset + m.offset, m.numel).fill_(true);
  EXPECT_EQ(host.masked_select(used.logical_not()).abs().sum().item<double>(), 0.0);
}

}  // namespace

TEST(FlatBucketsCuda, ParksInHostMemoryOnlyWhenTheDeviceHasNoRoomForTwoCopies) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  ciuic::kit::FlatBuckets::Options o;
  o.pad_multiple = 3;
  // First, before the caching allocator holds anything (the cap bounds what it reserves, not what
  // it hands out from its cache): a cap of 1.5 models, so the flat buffer cannot join the model.
  {
    const int64_t scale = int64_t{16} << 20;  // 6 x 16 Mi bf16 elements: about 192 MiB
    o.bucket_elements = 2 * scale;
    auto params = make_params(scale);
    std::vector<at::Tensor> want;
    int64_t bytes = 0;
    for (const auto& p : params) {
      want.push_back(p.tensor.detach().cpu());
      bytes += p.tensor.nbytes();
    }
    ciuic::launch::apply_memory_cap(0, 1.5 * static_cast<double>(bytes) / (1 << 30));
    ciuic::kit::FlatBuckets fb(params, o);
    EXPECT_TRUE(fb.parked());
    expect_views_with_values(fb, params, want);
  }
  // A model an eighth the size: room for both under the same cap, device to device.
  const int64_t scale = int64_t{2} << 20;
  o.bucket_elements = 2 * scale;
  auto params = make_params(scale);
  std::vector<at::Tensor> want;
  for (const auto& p : params) want.push_back(p.tensor.detach().cpu());
  ciuic::kit::FlatBuckets fb(params, o);
  EXPECT_FALSE(fb.parked());
  expect_views_with_values(fb, params, want);
}
