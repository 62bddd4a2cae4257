"""A tuned schedule inside transformers' own ``model.generate``, on a padded batch of prompts.

python examples/generate_with_transformers.py [runs/smollm2-135m-qa-stages/recommended.json]

The model is a plain ``transformers`` model; the code calling ``generate`` is the user's own. Inside
``lazyllm.apply`` each prompt's prefill is pruned by the schedule and the batch decodes together;
afterwards the model is exactly as before.
"""

import sys

import lazyllm
from lazyllm import LazyLLM, Schedule, load_model

model, tokenizer = load_model("smollm2-135m")  # an ordinary LlamaForCausalLM and its tokenizer
schedule = Schedule.load(sys.argv[1]) if len(sys.argv) > 1 else Schedule.paper_style("smollm2-135m", 30)
schedule = schedule.with_revival("frozen")  # frozen decoding: the batch's steps run together

story = " ".join(["The harbour town kept its lighthouse lit every night of the year."] * 30)
prompts = [
    story + "\nQuestion: What did the town keep lit?\nAnswer:",
    "The capital of France is",
    story[:400] + "\nIn one word, the building by the harbour is a",
]
inputs = tokenizer(prompts, padding=True, padding_side="left", return_tensors="pt")

with lazyllm.apply(model, schedule):
    out = model.generate(**inputs, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.eos_token_id)

width = inputs["input_ids"].shape[1]
engine = LazyLLM(model, schedule, tokenizer=tokenizer)
for text, row, mask in zip(prompts, out, inputs["attention_mask"]):
    answer = tokenizer.decode(row[width:], skip_special_tokens=True)
    alone = engine.generate(text, max_new_tokens=12)  # the same prompt alone through the engine
    print(f"{int(mask.sum()):4d} prompt tokens -> {answer!r}  (LazyLLM.generate alone: {alone.text!r})")
