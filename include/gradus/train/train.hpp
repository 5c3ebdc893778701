#pragma once
// Training: optimizers, learning-rate schedules, initializers, the training step and
// Hogwild! (lock-free multi-threaded SGD).
#include "gradus/train/hogwild.hpp"
#include "gradus/train/init.hpp"
#include "gradus/train/optimizer.hpp"
#include "gradus/train/schedule.hpp"
#include "gradus/train/train_step.hpp"
