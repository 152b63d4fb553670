// SPDX-License-Identifier: Apache-2.0
// Anchor of the shared <torch/torch.h> precompiled header.
