#pragma once
// Training: optimizers, learning-rate schedules, initializers and the training step.
#include "gradus/train/init.hpp"
#include "gradus/train/optimizer.hpp"
#include "gradus/train/schedule.hpp"
#include "gradus/train/train_step.hpp"
