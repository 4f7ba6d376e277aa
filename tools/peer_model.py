"""The model of the peer scripts (peer_train_torch.py, peer_generate_hf.py): the Qwen3-0.6B
shape of bench_train and bench_decode in transformers, with PyTorch's SDPA attention."""
from transformers import Qwen3Config


def qwen3_0_6b_config():
    config = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                         max_position_embeddings=4096)
    config._attn_implementation = "sdpa"
    return config
