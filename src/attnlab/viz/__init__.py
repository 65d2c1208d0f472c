"""Pictures of what the models do: one module per picture, each with a function that computes the
numbers and one that draws them (matplotlib, imported only when drawing: the `viz` extra).

    attention        one token's attention per layer and head, a head's full map, cross-attention
    attention_html   the interactive attention page (self-contained HTML)
    context          a word's contextual vector in two sentences, layer by layer
    positions        sinusoidal encodings (heatmap, clocks, PE(p)·PE(p+k)) and RoPE
    masks            the boolean masks of a padded Multi30k batch
    teacher_forcing  a teacher-forced pass against greedy decoding
    schedule         learning-rate schedules of recipes, label smoothing
    training         curves from runs' metrics.jsonl
    complexity       measured time and memory of attention against length (peak_memory: the probe)
    kv_cache         decoding time with and without the KV cache; MHA/GQA/MQA cache sizes
    moe              mixture-of-experts routing
    bpe              BPE merges (tokenizers/viz.py)
    gallery          `viz all`: every figure and index.html
    sources          every model, run, recipe and data set the pictures load
    capture          forward hooks reading attention weights, hidden states and routing
    figure           title, caption and small PNGs shared by the figures
    cli              `attnlab viz KIND ...`
"""
