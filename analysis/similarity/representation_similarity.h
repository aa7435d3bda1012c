// The data-based and weight-based baselines reported beside tensor similarity (docs/methods.md
// §3.4): linear CKA, biased and debiased, on activations (rows are examples); behavioural
// agreement and output correlation on logits; the naive cosine of two models' weights.
#pragma once
#include "engine/matrix64.h"
#include "engine/module.h"

namespace adjoint {

// Linear CKA of two activation matrices over the same n examples (n × p and n × q):
// ‖Yᵀ X‖²_F / (‖Xᵀ X‖_F ‖Yᵀ Y‖_F) after centring each column (Kornblith et al. 2019).
double linear_cka(const Matrix64& x, const Matrix64& y);
// The same with the unbiased HSIC estimator of Song et al. (2012) on the Gram matrices,
// which removes the bias of finite n (needs n ≥ 4); computed without forming them, so n may
// be a token count in the hundreds of thousands.
double linear_cka_debiased(const Matrix64& x, const Matrix64& y);

// The share of examples whose arg-max agrees, and the Pearson correlation of all logits.
double prediction_agreement(const Matrix64& logits_a, const Matrix64& logits_b);
double output_correlation(const Matrix64& logits_a, const Matrix64& logits_b);

// Cosine of the two models' parameters flattened in name order; throws naming the first
// parameter whose name or shape differs.
double weight_cosine(const Module& a, const Module& b);

}  // namespace adjoint
