"""Errors every layer may raise; each service translates them into its caller's terms."""

from __future__ import annotations


class CrescentError(Exception):
    """Base of the errors Crescent raises on purpose; the message is meant for the caller."""


class ModelNotFoundError(CrescentError):
    """The model file or directory does not exist or is not a model Crescent can load."""


class UnsupportedModelError(ModelNotFoundError):
    """The model exists, but its architecture or a setting of its config is one Crescent does
    not implement; the message names it (and, for architectures, lists the supported ones)."""


class InvalidRequestError(CrescentError):
    """A request or parameter is out of range; ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class PromptTooLongError(InvalidRequestError):
    """The prompt plus the requested completion does not fit the model's context."""

    def __init__(self, num_prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
        super().__init__(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the "
            f"prompt, {max_tokens} for the completion). Please reduce the prompt or max_tokens.",
            param="prompt",
        )
        self.num_prompt_tokens = num_prompt_tokens
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len
