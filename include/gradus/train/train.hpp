#pragma once
// Training: optimizers, learning-rate schedules, the training step and Hogwild!
// (lock-free multi-threaded SGD). The initializers moved to gradus/nn/init.hpp; this
// header still includes them (through the forwarding train/init.hpp) for one release.
#include "gradus/train/hogwild.hpp"
#include "gradus/train/init.hpp"
#include "gradus/train/optimizer.hpp"
#include "gradus/train/schedule.hpp"
#include "gradus/train/train_step.hpp"
