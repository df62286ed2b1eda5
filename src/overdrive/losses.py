"""Losses shared by the bench and the trainer: knowledge distillation (Hinton et al. 2015).

Below both `bench/` and `train/` (siblings that must not import each other)."""

from __future__ import annotations

import torch.nn.functional as F

__all__ = ["distill_loss"]


def distill_loss(student_logits, teacher_logits, targets, *, alpha: float = 0.5, temperature: float = 2.0):
    """alpha·CE(student, targets) + (1−alpha)·T²·KL(softmax(teacher/T) ‖ softmax(student/T)).

    The T² keeps the soft-target gradients on the scale of the hard ones (Hinton et al. 2015).
    """
    V = student_logits.size(-1)
    s = student_logits.float().reshape(-1, V)
    t = teacher_logits.float().reshape(-1, V)
    ce = F.cross_entropy(s, targets.reshape(-1))
    kl = F.kl_div(F.log_softmax(s / temperature, -1), F.log_softmax(t / temperature, -1), log_target=True,
                  reduction="batchmean")
    return alpha * ce + (1 - alpha) * temperature**2 * kl
