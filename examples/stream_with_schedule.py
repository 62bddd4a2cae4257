"""Stream a sampled answer from a tuned schedule: the pieces print as they are decoded.

python examples/stream_with_schedule.py [runs/smollm2-135m-qa-stages/recommended.json]
"""

import sys

from lazyllm import LazyLLM, Schedule, load_model

model, tokenizer = load_model("smollm2-135m")
schedule = Schedule.load(sys.argv[1]) if len(sys.argv) > 1 else Schedule.paper_style("smollm2-135m", 30)
llm = LazyLLM(model, schedule.with_revival("frozen"), tokenizer=tokenizer)
story = " ".join(["The harbour town kept its lighthouse lit every night of the year."] * 40)
messages = [
    {"role": "system", "content": "You answer questions about the text in one sentence."},
    {"role": "user", "content": story + "\nWhat did the town keep lit, and how often?"},
]
stream = llm.stream(messages, max_new_tokens=48, do_sample=True, temperature=0.7, top_p=0.9, seed=0)
for piece in stream:
    print(piece, end="", flush=True)
result = stream.result
print(
    f"\nfirst piece after {result.ttft_s:.2f} s, {len(result.token_ids)} tokens ({result.finish_reason}), "
    f"{100 * result.prompt_computed_fraction:.0f}% of prompt (token, layer) pairs computed"
)
