"""Tiny random targets of the families users train heads for, built locally from their real
config fields, each with a chat template written here in its family's format.

The templates reproduce what matters for eagle3 (headers and end-of-turn tokens, a default
system prompt, a template that refuses a system turn, reasoning kept only after the last user
turn, tool calls and tool results); they are written for these tests, not copied. The tokenizer
is the committed tiny target's byte-level BPE plus each family's special tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
TINY_TARGET = REPO / "models" / "tiny-target"

# ---------------------------------------------------------------- chat templates
_ARGS = "(c.function.arguments if c.function.arguments is string else c.function.arguments | tojson)"

LLAMA31 = (
    """{{- bos_token }}
{%- if messages[0].role == 'system' %}{%- set system = messages[0].content %}{%- set msgs = messages[1:] %}
{%- else %}{%- set system = '' %}{%- set msgs = messages %}{%- endif %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\nCutting Knowledge Date: December 2023\\n\\n' }}
{%- if tools %}{{- 'You may call these functions:\\n' }}{%- for t in tools %}{{- (t | tojson) + '\\n' }}{%- endfor %}{%- endif %}
{{- system + '<|eot_id|>' }}
{%- for m in msgs %}
  {%- if m.role == 'assistant' and m.tool_calls %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
    {%- for c in m.tool_calls %}{{- '{"name": "' + c.function.name + '", "parameters": ' + """
    + _ARGS
    + """ + '}' }}{%- endfor %}
    {{- '<|eot_id|>' }}
  {%- elif m.role == 'tool' %}
    {{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' }}
  {%- else %}
    {{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + (m.content | trim) + '<|eot_id|>' }}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"""
)

_CHATML_TOOLS = """{%- if tools %}
  {{- '<|im_start|>system\\n' + (messages[0].content + '\\n\\n' if messages[0].role == 'system' else DEFAULT_SYSTEM) }}
  {{- '# Tools\\n\\n<tools>' }}{%- for t in tools %}{{- '\\n' + (t | tojson) }}{%- endfor %}
  {{- '\\n</tools>\\n\\nCall a function inside <tool_call></tool_call> tags.<|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
  {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- else %}{{- DEFAULT_SYSTEM_BLOCK }}{%- endif %}"""

_CHATML_TOOL_CALLS = (
    """{%- if m.tool_calls %}{%- for c in m.tool_calls %}
      {%- if content or not loop.first %}{{- '\\n' }}{%- endif %}
      {{- '<tool_call>\\n{"name": "' + c.function.name + '", "arguments": ' + """
    + _ARGS
    + """ + '}\\n</tool_call>' }}
    {%- endfor %}{%- endif %}"""
)

_CHATML_TOOL_RESULT = """{%- elif m.role == 'tool' %}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
    {{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"""

# ChatML's turns as Qwen2.5 and Qwen3 render them: a user or system turn, an assistant turn's start...
_CHATML_TURNS_OPEN = """
{%- for m in messages %}
  {%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}
    {{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}
  {%- elif m.role == 'assistant' %}
    {%- set content = m.content or '' %}"""
# ...and its end: tool calls, the end of the turn, tool results, the generation prompt
_CHATML_TURNS_CLOSE = (
    _CHATML_TOOL_CALLS
    + """
    {{- '<|im_end|>\\n' }}"""
    + _CHATML_TOOL_RESULT
    + """
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"""
)

QWEN25 = (
    _CHATML_TOOLS.replace(
        "DEFAULT_SYSTEM_BLOCK", "'<|im_start|>system\\nYou are Qwen, a helpful assistant.<|im_end|>\\n'"
    ).replace("DEFAULT_SYSTEM", "'You are Qwen, a helpful assistant.\\n\\n'")
    + _CHATML_TURNS_OPEN
    + """
    {{- '<|im_start|>assistant' + ('\\n' + content if content else '\\n') }}"""
    + _CHATML_TURNS_CLOSE
    + """{%- endif %}"""
)

# Qwen3: reasoning (`reasoning_content`, or inline <think>...</think>) is rendered only for
# assistant turns after the last user turn; earlier turns lose it. enable_thinking=false puts an
# empty think block into the generation prompt.
QWEN3 = (
    _CHATML_TOOLS.replace("DEFAULT_SYSTEM_BLOCK", "''").replace("DEFAULT_SYSTEM", "''")
    + """
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}"""
    + _CHATML_TURNS_OPEN
    + """
    {%- set reasoning = '' %}
    {%- if m.reasoning_content is string %}{%- set reasoning = m.reasoning_content %}
    {%- elif '</think>' in content %}
      {%- set reasoning = content.split('</think>')[0].split('<think>')[-1] %}
      {%- set content = content.split('</think>')[-1] %}
    {%- endif %}
    {%- set reasoning = reasoning.strip('\\n') %}{%- set content = content.lstrip('\\n') %}
    {%- if loop.index0 > ns.last_user and (loop.last or reasoning) %}
      {{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content }}
    {%- else %}
      {{- '<|im_start|>assistant\\n' + content }}
    {%- endif %}"""
    + _CHATML_TURNS_CLOSE
    + """
  {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}"""
)

MISTRAL = """{{- bos_token }}
{%- if messages[0].role == 'system' %}{%- set system = messages[0].content %}{%- set msgs = messages[1:] %}
{%- else %}{%- set system = '' %}{%- set msgs = messages %}{%- endif %}
{%- set last_user = (msgs | selectattr('role', 'equalto', 'user') | list | length) %}
{%- set ns = namespace(users=0) %}
{%- for m in msgs %}
  {%- if (m.role == 'user') != (loop.index0 % 2 == 0) %}
    {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
  {%- endif %}
  {%- if m.role == 'user' %}{%- set ns.users = ns.users + 1 %}
    {{- '[INST] ' + (system + '\\n\\n' if system and ns.users == last_user else '') + m.content + '[/INST]' }}
  {%- else %}{{- ' ' + m.content + eos_token }}{%- endif %}
{%- endfor %}"""

_GEMMA_TURNS = """{%- for m in msgs %}
  {%- if (m.role == 'user') != (loop.index0 % 2 == 0) %}
    {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
  {%- endif %}
  {%- set role = 'model' if m.role == 'assistant' else m.role %}
  {{- '<start_of_turn>' + role + '\\n' + (prefix if loop.first else '') + (m.content | trim) + '<end_of_turn>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"""

GEMMA2 = (
    """{{- bos_token }}
{%- if messages[0].role == 'system' %}{{- raise_exception('System role not supported') }}{%- endif %}
{%- set msgs = messages %}{%- set prefix = '' %}
"""
    + _GEMMA_TURNS
)

GEMMA3 = (
    """{{- bos_token }}
{%- if messages[0].role == 'system' %}{%- set prefix = messages[0].content + '\\n\\n' %}{%- set msgs = messages[1:] %}
{%- else %}{%- set prefix = '' %}{%- set msgs = messages %}{%- endif %}
"""
    + _GEMMA_TURNS
)

# gpt-oss (harmony): the reasoning is an `analysis` channel message, kept only after the last
# user turn; answers are `final` messages; the generation prompt stops at `<|start|>assistant`.
GPT_OSS = (
    """{{- '<|start|>system<|message|>You are a helpful assistant.\\nReasoning: ' + (reasoning_effort or 'medium') }}
{{- '\\n\\n# Valid channels: analysis, commentary, final.<|end|>' }}
{%- if messages[0].role == 'system' or tools %}
  {{- '<|start|>developer<|message|>' + (messages[0].content if messages[0].role == 'system' else '') }}
  {%- if tools %}{{- '\\n\\n# Tools\\n' }}{%- for t in tools %}{{- (t | tojson) + '\\n' }}{%- endfor %}{%- endif %}
  {{- '<|end|>' }}
{%- endif %}
{%- set ns = namespace(last_user=-1, tool='') %}
{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}
{%- for m in messages %}
  {%- if m.role == 'user' %}{{- '<|start|>user<|message|>' + m.content + '<|end|>' }}
  {%- elif m.role == 'assistant' %}
    {%- set thinking = m.thinking if m.thinking is string else '' %}
    {%- if thinking and loop.index0 > ns.last_user %}
      {{- '<|start|>assistant<|channel|>analysis<|message|>' + thinking + '<|end|>' }}
    {%- endif %}
    {%- if m.tool_calls %}{%- for c in m.tool_calls %}{%- set ns.tool = c.function.name %}
      {{- '<|start|>assistant<|channel|>commentary to=functions.' + c.function.name + ' <|constrain|>json<|message|>' }}
      {{- """
    + _ARGS
    + """ + '<|call|>' }}
    {%- endfor %}
    {%- else %}
      {{- '<|start|>assistant<|channel|>final<|message|>' + m.content + ('<|return|>' if loop.last else '<|end|>') }}
    {%- endif %}
  {%- elif m.role == 'tool' %}
    {{- '<|start|>functions.' + ns.tool + ' to=assistant<|channel|>commentary<|message|>' + m.content + '<|end|>' }}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}"""
)


# ---------------------------------------------------------------- families
@dataclass(frozen=True)
class Family:
    name: str
    config_class: str
    model_class: str
    fields: dict
    template: str
    special: tuple[str, ...] = ()  # special tokens the family's tokenizer adds
    plain: tuple[str, ...] = ()  # added tokens that are not special (Qwen's <think>, <tool_call>)
    bos: str = "<|endoftext|>"
    eos: str = "<|im_end|>"
    vocab_pad: int = 0  # vocab_size past the tokenizer (Qwen2.5 pads its embedding matrix)
    window: int | None = None  # sliding window, when the family has one
    thinking: bool = False  # reasoning model (the template handles <think> / analysis)
    tags: frozenset = field(default_factory=frozenset)


_COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
)
# Gemma-2 and -3: a 48-token window, tied embeddings, their turn markers
_GEMMA_FIELDS = dict(_COMMON, head_dim=16, sliding_window=48, query_pre_attn_scalar=16, tie_word_embeddings=True)
_GEMMA_TOKENS: dict = dict(
    special=("<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"), bos="<bos>", eos="<end_of_turn>", window=48
)
_QWEN_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

FAMILIES = {
    "llama3.1": Family(
        "llama3.1",
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            _COMMON,
            head_dim=32,  # explicit head_dim != hidden / heads
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256,
            },
            tie_word_embeddings=False,
        ),
        LLAMA31,
        special=("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        bos="<|begin_of_text|>",
        eos="<|eot_id|>",
    ),
    "qwen2.5": Family(
        "qwen2.5",
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(_COMMON, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        QWEN25,
        plain=_QWEN_TOKENS[2:],
        vocab_pad=61,  # qkv bias, tied embeddings, embedding rows past the tokenizer
    ),
    "qwen3": Family(
        "qwen3",
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(_COMMON, head_dim=16, tie_word_embeddings=True),
        QWEN3,
        plain=_QWEN_TOKENS,
        thinking=True,
    ),
    "mistral": Family(
        "mistral",
        "MistralConfig",
        "MistralForCausalLM",
        dict(_COMMON, head_dim=16, sliding_window=48, tie_word_embeddings=False),
        MISTRAL,
        special=("<s>", "</s>", "[INST]", "[/INST]"),
        bos="<s>",
        eos="</s>",
        window=48,
    ),
    "qwen3-moe": Family(
        "qwen3-moe",
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(
            _COMMON,
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            decoder_sparse_step=1,
            tie_word_embeddings=False,
        ),
        QWEN3,
        plain=_QWEN_TOKENS,
        thinking=True,
    ),
    "gemma2": Family(
        "gemma2",
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(_GEMMA_FIELDS, final_logit_softcapping=30.0, attn_logit_softcapping=50.0),
        GEMMA2,
        **_GEMMA_TOKENS,
    ),
    "gemma3": Family(
        "gemma3",
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            _GEMMA_FIELDS,
            layer_types=["sliding_attention"] * 5 + ["full_attention"],
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
        ),
        GEMMA3,
        **_GEMMA_TOKENS,
    ),
    "gpt-oss": Family(
        "gpt-oss",
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(
            _COMMON,
            head_dim=16,
            intermediate_size=64,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=32,
            layer_types=["sliding_attention", "full_attention"] * 3,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 32.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 32,
            },
            tie_word_embeddings=False,
        ),
        GPT_OSS,
        special=(
            "<|start|>",
            "<|message|>",
            "<|channel|>",
            "<|constrain|>",
            "<|end|>",
            "<|return|>",
            "<|call|>",
        ),
        eos="<|return|>",
        window=32,
        thinking=True,
    ),
}

# family -> (SGLang serves it with an EAGLE-3 head, vLLM does): "yes" | "no" | "unknown" (a warning)
ENGINE_SUPPORT = {
    "llama3.1": ("yes", "yes"),
    "qwen2.5": ("yes", "yes"),
    "qwen3": ("yes", "yes"),
    "mistral": ("yes", "yes"),
    "qwen3-moe": ("yes", "yes"),
    "gemma2": ("no", "no"),
    "gemma3": ("yes", "unknown"),
    "gpt-oss": ("yes", "yes"),
}


def family_tokenizer(fam: Family):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TINY_TARGET))
    if fam.special:
        tok.add_special_tokens({"extra_special_tokens": list(fam.special)}, replace_extra_special_tokens=False)
    if fam.plain:
        tok.add_tokens(list(fam.plain))
    tok.bos_token, tok.eos_token = fam.bos, fam.eos
    tok.chat_template = fam.template
    return tok


def build_family_target(name: str, out: Path, seed: int = 0) -> Path:
    """A random model of family `name` saved like a real checkpoint, with its tokenizer/template."""
    import transformers

    fam = FAMILIES[name]
    tok = family_tokenizer(fam)
    torch.manual_seed(seed)
    cfg = getattr(transformers, fam.config_class)(
        vocab_size=len(tok) + fam.vocab_pad,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **fam.fields,
    )
    model = getattr(transformers, fam.model_class)(cfg)
    if name.startswith("gemma"):
        # Gemma stores its norm weights zero-centred; random-init them away from 0 so a wrong
        # (1 + w) handling cannot hide behind zeros.
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith("norm.weight"):
                    p.normal_(0.0, 0.3)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


# ---------------------------------------------------------------- reasoning and tool conversations
THINK = [
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "It is 5.", "reasoning_content": "Add two and three."},
    {"role": "user", "content": "And 2 + 4?"},
    {"role": "assistant", "content": "6.", "reasoning_content": "Two plus four is six."},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
TOOL_CONV = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": '{"temp": 21}'},
    {"role": "assistant", "content": "It is 21 degrees in Paris."},
    {"role": "user", "content": "Thanks!"},
    {"role": "assistant", "content": "You are welcome."},
]
