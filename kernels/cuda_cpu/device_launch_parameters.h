// Stands in for the CUDA header of this name on the CPU emulator: see cuda_cpu.h.
#pragma once
#include "cuda_cpu.h"
