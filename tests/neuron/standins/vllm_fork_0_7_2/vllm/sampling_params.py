"""Stand-in of the fork's SamplingParams (vllm/sampling_params.py:88-214, a msgspec Struct): the input
fields with their defaults; an unknown keyword raises TypeError, as msgspec does."""

_FIELDS = {
    "n": 1,
    "best_of": None,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "seed": None,
    "stop": None,
    "stop_token_ids": None,
    "bad_words": None,
    "ignore_eos": False,
    "max_tokens": 16,
    "min_tokens": 0,
    "logprobs": None,
    "prompt_logprobs": None,
    "detokenize": True,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "logits_processors": None,
    "include_stop_str_in_output": False,
    "truncate_prompt_tokens": None,
    "guided_decoding": None,
    "logit_bias": None,
    "allowed_token_ids": None,
}


class SamplingParams:
    def __init__(self, **kwargs):
        for key in kwargs:
            if key not in _FIELDS:
                raise TypeError(f"Unexpected keyword argument '{key}'")
        for key, default in _FIELDS.items():
            setattr(self, key, kwargs.get(key, default))
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
