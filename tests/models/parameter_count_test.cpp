// Parameter counts of the zoo against published figures.
//
// Exact counts come from the released checkpoints (Hugging Face configs / model cards,
// torchvision), where the authors give them to the parameter. Papers that round (GPT-3's
// "175.0B", BERT's "340M") are checked to their printed precision or noted.
#include <gtest/gtest.h>

#include <cmath>

#include "sextant/models/counts.hpp"
#include "sextant/models/lowering.hpp"
#include "sextant/models/zoo.hpp"

namespace sextant::models {
namespace {

int64_t count(const char* name) {
  return parameter_count(zoo_model(name));
}

TEST(ParameterCount, ExactCountsOfReleasedCheckpoints) {
  // Hugging Face transformers, model.num_parameters() of the released checkpoints.
  EXPECT_EQ(count("gpt2-124m"), 124'439'808);        // gpt2
  EXPECT_EQ(count("gpt2-350m"), 354'823'168);        // gpt2-medium
  EXPECT_EQ(count("gpt2-774m"), 774'030'080);        // gpt2-large
  EXPECT_EQ(count("gpt2-1.5b"), 1'557'611'200);      // gpt2-xl
  EXPECT_EQ(count("llama2-7b"), 6'738'415'616);      // meta-llama/Llama-2-7b-hf
  EXPECT_EQ(count("llama2-13b"), 13'015'864'320);    // meta-llama/Llama-2-13b-hf
  EXPECT_EQ(count("llama2-70b"), 68'976'648'192);    // meta-llama/Llama-2-70b-hf
  EXPECT_EQ(count("llama3-8b"), 8'030'261'248);      // meta-llama/Meta-Llama-3-8B
  EXPECT_EQ(count("llama3-70b"), 70'553'706'496);    // meta-llama/Meta-Llama-3-70B
  EXPECT_EQ(count("llama3-405b"), 405'853'388'800);  // meta-llama/Llama-3.1-405B
  EXPECT_EQ(count("bert-large"), 335'141'888);       // bert-large-uncased BertModel (with pooler)
  // torchvision.models, sum(p.numel() for p in model.parameters()).
  EXPECT_EQ(count("resnet50"), 25'557'032);
  EXPECT_EQ(count("wrn50-2"), 68'883'240);  // Wide_ResNet50_2_Weights meta num_params
  EXPECT_EQ(count("vgg19"), 143'667'240);
  EXPECT_EQ(count("alexnet"), 61'100'840);
}

TEST(ParameterCount, MegatronTable1ToThePublishedPrecision) {
  // Narayanan et al. SC'21 Table 1 prints billions with one decimal.
  struct Row {
    const char* name;
    double billions;
  };
  for (Row row : {Row{"megatron-1.7b", 1.7}, Row{"megatron-3.6b", 3.6}, Row{"megatron-7.5b", 7.5},
                  Row{"megatron-18b", 18.4}, Row{"megatron-39b", 39.1}, Row{"megatron-76b", 76.1},
                  Row{"megatron-145b", 145.6}, Row{"megatron-310b", 310.1},
                  Row{"megatron-530b", 529.6}, Row{"megatron-1t", 1008.0}}) {
    double b = static_cast<double>(count(row.name)) / 1e9;
    EXPECT_NEAR(std::round(b * 10) / 10, row.billions, 1e-9) << row.name << " has " << b << "B";
  }
}

TEST(ParameterCount, MatchesNarayananClosedForm) {
  // Narayanan et al. SC'21 eq. (2): P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)), tied
  // embeddings, learned positions. Check it exactly for GPT-3 175B.
  const double l = 96, h = 12288, V = 50257, s = 2048;
  double p = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h));
  // The closed form omits the final layer norm (2h parameters).
  EXPECT_NEAR(static_cast<double>(count("gpt3-175b")), p + 2 * h, 1.0);
}

TEST(ParameterCount, PapersThatRound) {
  // GPT-3: Brown et al. print 175.0B; the architecture gives 174.6B (0.23% less): the paper rounds.
  EXPECT_NEAR(static_cast<double>(count("gpt3-175b")) / 175.0e9, 1.0, 0.005);
  // BERT-large: Devlin et al. print 340M; the released checkpoint has 335.1M.
  EXPECT_NEAR(static_cast<double>(count("bert-large")) / 340e6, 1.0, 0.02);
  // ResNet-50: He et al. / torchvision print 25.6M.
  EXPECT_NEAR(static_cast<double>(count("resnet50")) / 25.6e6, 1.0, 0.002);
}

TEST(ParameterCount, TensorParallelShardsAddUpToTheWhole) {
  spec::ModelSpec m = zoo_model("gpt3-1.3b");
  LoweredModel one = lower(m, {1, 0, spec::Dtype::kBf16, 1, false});
  LoweredModel four = lower(m, {1, 0, spec::Dtype::kBf16, 4, false});
  const Layer& a = one.layers[1];
  const Layer& b = four.layers[1];
  // Replicated per rank: the two layer norms (4h) and the row-parallel biases (2h).
  const int64_t h = 2048;
  EXPECT_EQ(4 * (b.params - 6 * h) + 6 * h, a.params);
}

}  // namespace
}  // namespace sextant::models
