"""Torch reference of upstream's models/losses.py: stablemax/softmax CE and ACTLossHead.

Fixed: upstream's softmax_cross_entropy does not accept the `valid_mask` keyword the head passes
(TypeError); here both losses accept it. The port models/trm/losses.py mirrors this file
(`ACTLossHead` is its pure function `act_loss`).

Axis names in variable suffixes: B batch, L labelled positions (seq_len), V vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_LABEL_ID = -100


def _s(x, epsilon=1e-30):
    return torch.where(x < 0, 1 / (1 - x + epsilon), x + 1)


def log_stablemax(x, dim=-1):
    s_x = _s(x)
    return torch.log(s_x / torch.sum(s_x, dim=dim, keepdim=True))


def stablemax_cross_entropy(logits, labels, ignore_index: int = IGNORE_LABEL_ID, valid_mask=None):
    logprobs_blv = log_stablemax(logits.to(torch.float64), dim=-1)
    if valid_mask is None:
        valid_mask = labels != ignore_index
    safe_bl = torch.where(valid_mask, labels, 0)
    picked_bl = torch.gather(
        logprobs_blv, index=safe_bl.to(torch.long).unsqueeze(-1), dim=-1
    ).squeeze(-1)
    return -torch.where(valid_mask, picked_bl, 0)


def softmax_cross_entropy(logits, labels, ignore_index: int = IGNORE_LABEL_ID, valid_mask=None):
    del valid_mask  # ignore_index already masks; accepted so the head's call works
    flat = F.cross_entropy(
        logits.to(torch.float32).view(-1, logits.shape[-1]),
        labels.to(torch.long).view(-1),
        ignore_index=ignore_index,
        reduction="none",
    )
    return flat.view(labels.shape)


class ACTLossHead(nn.Module):
    def __init__(self, model: nn.Module, loss_type: str = "stablemax_cross_entropy"):
        super().__init__()
        self.model = model
        self.loss_fn = {
            "stablemax_cross_entropy": stablemax_cross_entropy,
            "softmax_cross_entropy": softmax_cross_entropy,
        }[loss_type]

    def initial_carry(self, *args, **kwargs):
        return self.model.initial_carry(*args, **kwargs)

    def forward(self, return_keys=(), **model_kwargs):
        new_carry, outputs = self.model(**model_kwargs)
        labels_bl = new_carry.current_data["labels"]  # the labels of the data in each slot
        with torch.no_grad():
            outputs["preds"] = torch.argmax(outputs["logits"], dim=-1)
            mask_bl = labels_bl != IGNORE_LABEL_ID
            counts_b = mask_bl.sum(-1)
            divisor_b1 = counts_b.clamp_min(1).unsqueeze(-1)
            is_correct_bl = mask_bl & (outputs["preds"] == labels_bl)
            seq_correct_b = is_correct_bl.sum(-1) == counts_b
            valid_b = new_carry.halted & (counts_b > 0)
            metrics = {
                "count": valid_b.sum(),
                "accuracy": torch.where(
                    valid_b, (is_correct_bl.to(torch.float32) / divisor_b1).sum(-1), 0
                ).sum(),
                "exact_accuracy": (valid_b & seq_correct_b).sum(),
                "q_halt_accuracy": (
                    valid_b & ((outputs["q_halt_logits"] >= 0) == seq_correct_b)
                ).sum(),
                "steps": torch.where(valid_b, new_carry.steps, 0).sum(),
            }
        lm_loss = (
            self.loss_fn(
                outputs["logits"], labels_bl, ignore_index=IGNORE_LABEL_ID, valid_mask=mask_bl
            )
            / divisor_b1
        ).sum()
        q_halt_loss = F.binary_cross_entropy_with_logits(
            outputs["q_halt_logits"],
            seq_correct_b.to(outputs["q_halt_logits"].dtype),
            reduction="sum",
        )
        metrics.update({"lm_loss": lm_loss.detach(), "q_halt_loss": q_halt_loss.detach()})
        q_continue_loss = 0
        if "target_q_continue" in outputs:
            q_continue_loss = F.binary_cross_entropy_with_logits(
                outputs["q_continue_logits"], outputs["target_q_continue"], reduction="sum"
            )
            metrics["q_continue_loss"] = q_continue_loss.detach()
        detached = {k: outputs[k].detach() for k in return_keys if k in outputs}
        return (
            new_carry,
            lm_loss + 0.5 * (q_halt_loss + q_continue_loss),
            metrics,
            detached,
            new_carry.halted.all(),
        )
