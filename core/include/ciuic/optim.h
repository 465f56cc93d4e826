// ciuic/optim.h — AdamW hyper-parameters, shared by the trainer, the Sharding and the Offload.
//
// The update is PyTorch's AdamW (decoupled weight decay), for parameter p, gradient g, step t:
//   p  <- p * (1 - lr * weight_decay)
//   m  <- beta1 * m + (1 - beta1) * g
//   v  <- beta2 * v + (1 - beta2) * g^2
//   p  <- p - lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
// Weight decay applies only to segments marked for it (matrices; not norms or biases).
#pragma once

namespace ciuic {

struct AdamWHyper {
  double lr = 1e-3;  // the scheduled learning rate of this step
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

}  // namespace ciuic
