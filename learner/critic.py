"""PPO's critic: the policy's transformer body with a scalar head, trained as its own engine."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class ValueModel(nn.Module):
    """V(prefix) for every position, aligned like `algorithms.token_logprobs`: values[:, t] is
    the value of the state *before* token t is generated (the hidden state at t-1), so the value
    and the logprob of a model token describe the same decision; position 0 gets 0.

    The body starts from the policy checkpoint (a common PPO choice when no reward model exists);
    the head starts at zero so the first values are 0 and the first advantages are the returns.
    """

    def __init__(self, model_path: str, *, dtype: torch.dtype = torch.float32) -> None:
        from transformers import AutoModel

        super().__init__()
        self.body = AutoModel.from_pretrained(model_path, dtype=dtype)
        self.head = nn.Linear(self.body.config.hidden_size, 1, dtype=dtype)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: Tensor) -> Tensor:
        hidden = self.body(input_ids=input_ids).last_hidden_state
        v = self.head(hidden[:, :-1]).squeeze(-1).float()
        return torch.cat([torch.zeros_like(v[:, :1]), v], dim=1)
