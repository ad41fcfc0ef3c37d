"""A failed CUDA build, as torch.utils.cpp_extension reports it, cut to its first errors with their source lines."""

from __future__ import annotations

from ksearch_graph.harness.candidate.build_errors import MAX_CHARS, build_error_excerpt

BUILD = "/root/.cache/ksearch/torch-extensions/ksearch_ext_0123456789abcdef"
NVCC = f"""Error building extension 'ksearch_ext_0123456789abcdef': [1/3] /usr/local/cuda/bin/nvcc --generate-dependencies-with-compile --dependency-output kernel.cuda.o.d -DTORCH_EXTENSION_NAME=ksearch_ext -I{BUILD}/src -isystem /usr/include/python3.11 -O3 --use_fast_math -c {BUILD}/src/kernel.cu -o kernel.cuda.o
FAILED: kernel.cuda.o
/usr/local/cuda/bin/nvcc --generate-dependencies-with-compile -I{BUILD}/src -O3 -c {BUILD}/src/kernel.cu -o kernel.cuda.o
{BUILD}/src/kernel.cu(12): error: identifier "tile_k" is undefined
      float acc = q[i] * k[tile_k * 64 + j];
                           ^

{BUILD}/src/kernel.cu(31): error: expected a ";"
      int offset = a/b/c
                        ^

{BUILD}/src/kernel.cu(40): warning #177-D: variable "unused" was declared but never referenced

2 errors detected in the compilation of "{BUILD}/src/kernel.cu".
[2/3] c++ -MMD -MF main.o.d -DTORCH_EXTENSION_NAME=ksearch_ext -I{BUILD}/src -fPIC -std=c++17 -c {BUILD}/src/main.cpp -o main.o
FAILED: main.o
c++ -MMD -MF main.o.d -I{BUILD}/src -fPIC -std=c++17 -c {BUILD}/src/main.cpp -o main.o
{BUILD}/src/main.cpp: In function 'at::Tensor run(at::Tensor)':
{BUILD}/src/main.cpp:5:12: error: 'launch' was not declared in this scope
    5 |     return launch(x);
      |            ^~~~~~
ninja: build stopped: subcommand failed.
"""


def test_keeps_the_first_errors_with_their_source_lines_and_no_command_lines():
    out = build_error_excerpt(NVCC)
    lines = out.splitlines()
    assert lines[0] == 'kernel.cu(12): error: identifier "tile_k" is undefined'
    assert lines[1].strip() == "float acc = q[i] * k[tile_k * 64 + j];" and lines[2].strip() == "^"
    assert 'kernel.cu(31): error: expected a ";"' in out and "int offset = a/b/c" in out  # code is left as it is
    assert "main.cpp: In function 'at::Tensor run(at::Tensor)':\nmain.cpp:5:12: error: 'launch' was not declared" \
        in out and "    5 |     return launch(x);" in out
    assert '2 errors detected in the compilation of "kernel.cu".' in out
    assert "nvcc" not in out and "-I" not in out and "FAILED" not in out and BUILD not in out
    assert "warning" not in out  # a warning is not the cause


def test_many_errors_are_counted_not_shown():
    errors = "\n".join(f"/tmp/b/kernel.cu({i}): error: bad thing {i}\n    code {i}\n    ^\n" for i in range(1, 40))
    out = build_error_excerpt(errors)
    assert out.startswith("kernel.cu(1): error: bad thing 1\n    code 1\n    ^")
    assert "more error(s) not shown" in out and len(out) <= MAX_CHARS + 200
    assert "bad thing 39" not in out


def test_linker_errors_and_no_error_at_all():
    link = "ImportError: /tmp/x/ksearch_ext_1.so: undefined symbol: _Z6launchN2at6TensorE"
    assert build_error_excerpt(link) == "ImportError: ksearch_ext_1.so: undefined symbol: _Z6launchN2at6TensorE"
    assert build_error_excerpt("[1/2] c++ -c main.cpp -o main.o\nninja: no work to do.") == ""
