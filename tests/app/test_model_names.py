"""Display names of models: a clean human name from general.name, the repo id and the file name."""

from app.model_names import display_name, reply_author


def test_a_plausible_general_name_is_kept_without_quantization_words():
    assert display_name("Qwen2.5 0.5B Instruct", "qwen2.5-0.5b-instruct-q4_k_m.gguf") == "Qwen2.5 0.5B Instruct"
    assert display_name("Meta Llama 3.1 8B Instruct", "Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf") == \
        "Meta Llama 3.1 8B Instruct"
    # an "AWQ" label on a Q4_K_M file describes the source it was converted from, not this file
    assert display_name("Qwen2.5 7B Instruct AWQ", "qwen2.5-7b-instruct-q4_k_m.gguf") == "Qwen2.5 7B Instruct"


def test_an_odd_general_name_gives_way_to_the_repo_id_or_the_file_name():
    odd = "Smollm2 135M 8k Lc100K Mix1 Ep2"
    assert display_name(odd, "/models/SmolLM2-135M-Instruct-Q8_0.gguf") == "SmolLM2 135M Instruct"
    assert display_name(odd, "model.gguf", "bartowski/SmolLM2-135M-Instruct-GGUF") == "SmolLM2 135M Instruct"
    assert display_name(None, "C:\\models\\gemma-3-1b-pt.Q4_K_M.gguf") == "gemma 3 1b pt"
    assert display_name(None, "Llama-3.2-1B-Instruct-BF16-00001-of-00002.gguf") == "Llama 3.2 1B Instruct"


def test_without_a_better_source_the_general_name_or_a_placeholder_stays():
    assert display_name("Smollm2 135M 8k Lc100K Mix1 Ep2") == "Smollm2 135M 8k Lc100K Mix1 Ep2"
    assert display_name("Tiny Story Teller", "model.gguf") == "Tiny Story Teller"
    assert display_name(None, None) == "Unknown model"
    assert len(display_name("x" * 500)) == 80


def test_a_reply_s_author_comes_from_its_stats():
    assert reply_author({"model_name": "Qwen2.5 0.5B Instruct", "model": "qwen"}, "Now loaded") == \
        "Qwen2.5 0.5B Instruct"
    # replies from before the display name was recorded: the file's general.name, cleaned
    assert reply_author({"model": "Qwen2.5 7B Instruct AWQ"}, "Now loaded") == "Qwen2.5 7B Instruct"
    assert reply_author({}, "Now loaded") == "Now loaded"
    assert reply_author({"model_name": 42, "model": None}, "Now loaded") == "Now loaded"  # imported junk
    assert reply_author({"model_name": "two\nlines  here"}, "") == "two lines here"
