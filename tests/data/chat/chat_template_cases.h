// The language-feature cases of chat_template_test: a template, its context
// (JSON) and the exact output of Jinja2 under transformers' settings. The
// oracle test renders every case with Python as well, so the expected strings
// stay Jinja's truth and not ours.
#pragma once
#include <vector>

namespace colossus::data::chat::testing {

struct FeatureCase {
  const char* name;
  const char* template_source;
  const char* context;
  const char* expected;
};

inline const std::vector<FeatureCase>& feature_cases() {
  static const std::vector<FeatureCase> cases = {
      {"text", R"j(Hello, world)j", R"j({})j", R"j(Hello, world)j"},
      {"trailing_newline", "a\n\n", R"j({})j", "a\n"},
      {"crlf", "a\r\nb\rc\n", R"j({})j", "a\nb\nc"},
      {"variable", R"j({{ name }}!)j", R"j({"name": "Ann"})j", R"j(Ann!)j"},
      {"literals",
       R"j({{ 'a' }}{{ "b" }}{{ 1 }}{{ 1.5 }}{{ true }}{{ none }}{{ [1, 'x'] }}{{ {'k': none} }}{{ 'con' 'cat' }})j",
       R"j({})j", R"j(ab11.5TrueNone[1, 'x']{'k': None}concat)j"},
      {"if_elif_else",
       R"j({% for n in [1, 2, 3] %}{% if n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif %},{% endfor %})j",
       R"j({})j", R"j(one,two,many,)j"},
      {"loop_variables",
       R"j({% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }}|{% endfor %})j",
       R"j({"xs": ["a", "b"]})j", R"j(10TrueFalse221|21FalseTrue210|)j"},
      {"loop_neighbours",
       R"j({% for x in [1, 2, 3] %}{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }}{{ loop.cycle('a', 'b') }} {% endfor %})j",
       R"j({})j", R"j(<1>2a 1<2>3b 2<3>a )j"},
      {"loop_filter_else",
       R"j({% for x in [1, 2, 3, 4] if x is even %}{{ x }}/{{ loop.length }} {% else %}none{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %})j",
       R"j({})j", R"j(2/2 4/2 |empty)j"},
      {"loop_unpack",
       R"j({% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for (k, v) in [['x', 1]] %}{{ k }}{{ v }}{% endfor %})j",
       R"j({"d": {"b": 1, "a": 2}})j", R"j(b=1;a=2;x1)j"},
      {"loop_dict_and_string", R"j({% for k in d %}{{ k }}{% endfor %}|{% for c in 'hé!' %}[{{ c }}]{% endfor %})j",
       R"j({"d": {"b": 1, "a": 2}})j", R"j(ba|[h][é][!])j"},
      {"break_continue",
       R"j({% for x in range(10) %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %})j",
       R"j({})j", R"j(023)j"},
      {"nested_loops",
       R"j({% for a in [1, 2] %}{% set outer = loop.index %}{% for b in 'xy' %}{{ outer }}{{ b }}{{ loop.index }} {% endfor %}{% endfor %})j",
       R"j({})j", R"j(1x1 1y2 2x1 2y2 )j"},
      {"set_scoping",
       R"j({% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}{% if true %}{% set x = 9 %}{% endif %}{{ x }}{% for i in [1, 2] %}{% if i == 1 %}{% set y = 5 %}{% endif %}[{{ y }}]{% endfor %})j",
       R"j({})j", R"j(2319[5][])j"},
      {"namespace",
       R"j({% set ns = namespace(total=0, seen=false) %}{% for i in [1, 2, 3] %}{% set ns.total = ns.total + i %}{% set ns.last = i %}{% endfor %}{{ ns.total }} {{ ns.seen }} {{ ns.last }})j",
       R"j({})j", R"j(6 False 3)j"},
      {"set_block_and_tuple",
       R"j({% set greeting %}Hi {{ name }}{% endset %}[{{ greeting }}]{% set a, b = 1, 2 %}{{ a }}{{ b }})j",
       R"j({"name": "Bo"})j", R"j([Hi Bo]12)j"},
      {"whitespace_control", "a  {{- ' b ' -}}  c\n  {%- if true -%}\n  d  \n{%- endif %}\n\n  {{- 'e' }}", R"j({})j",
       R"j(a b cde)j"},
      {"trim_and_lstrip_blocks",
       "{% if true %}\n    yes\n{% endif %}\n  {% for x in [1, 2] %}\n{{ x }}\n  {% endfor %}\nend {% if true %}  "
       "kept\n{% endif %}",
       R"j({})j", "    yes\n1\n2\nend   kept\n"},
      {"lstrip_only_at_line_start", "x  {% if true %}y{% endif %}\n  {{ 'v' }}\n\t{% if true %}z{% endif %}", R"j({})j",
       "x  y  v\nz"},
      {"plus_disables_stripping", "  {%+ if true +%}\nx{% endif %}", R"j({})j", "  \nx"},
      {"comments", "a{# note #}b\n{# own line #}\nc  {#- trimmed -#}  d\n  {# indented #}\ne", R"j({})j", "ab\ncd\ne"},
      {"attribute_and_item",
       R"j({{ m.role }} {{ m['content'] }} [{{ m.missing }}] {{ ms[0].role }} {{ ms[-1]['role'] }} {{ ms.0.role }} [{{ ms[5] }}])j",
       R"j({"m": {"role": "user", "content": "hi"}, "ms": [{"role": "a"}, {"role": "b"}]})j",
       R"j(user hi [] a b a [])j"},
      {"slicing",
       R"j({{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ 'héllo'[1:3] }} {{ 'abc'[-1] }} {{ xs[5:] }})j",
       R"j({"xs": [1, 2, 3]})j", R"j([2, 3] [1, 2] [3, 2, 1] [1, 3] él c [])j"},
      {"arithmetic",
       R"j({{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 1.5 + 1 }} {{ 'a' ~ 1 ~ none }} {{ 'ab' * 2 }} {{ [1] + [2] }} {{ -3 }} {{ 7.5 // 2 }} {{ true + 1 }})j",
       R"j({})j", R"j(7 9 3.5 2.0 3 -4 1 2 1024 2.5 a1None abab [1, 2] -3 3.0 2)j"},
      {"comparisons_and_logic",
       R"j({{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ 'b' in 'abc' }} {{ 2 not in [1, 2] }} {{ 'k' in d }} {{ not 0 }} {{ 0 or 'x' }} {{ 1 and 'y' }} {{ none and 1 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }})j",
       R"j({"d": {"k": 1}})j", R"j(True False True True True False True True x y None True True)j"},
      {"tests",
       R"j({{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ n is none }} {{ x is not none }} {{ x is string }} {{ 1 is number }} {{ 1 is integer }} {{ 1.0 is float }} {{ true is boolean }} {{ d is mapping }} {{ [1] is iterable }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 'a' is eq 'a' }} {{ 'x' is in ['x'] }} {{ 'ab' is lower }} {{ true is true }} {{ 1 is sameas 1 }})j",
       R"j({"x": "s", "n": null, "d": {}})j",
       R"j(True False True True True True True True True True True True True True True True True True True True)j"},
      {"tests_bind_tighter_than_not",
       R"j({{ not x is defined }} {{ not y is defined }} {{ x is defined and y is not defined }})j", R"j({"x": 1})j",
       R"j(False True True)j"},
      {"inline_if",
       R"j({{ 'yes' if x else 'no' }} {{ 'yes' if n else 'no' }} [{{ 'only' if n }}] {{ 'a' if false else 'b' if true else 'c' }})j",
       R"j({"x": 1, "n": 0})j", R"j(yes no [] b)j"},
      {"filters_strings",
       R"j({{ '  a b  ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ 'aB' | upper }}|{{ 'aB' | lower }}|{{ 'hELLO world' | capitalize }}|{{ 3 | string ~ '!' }}|{{ 'a-b-c' | replace('-', '+') }}|{{ 'a-b-c' | replace('-', '', 1) }}|{{ 'abc' | reverse }})j",
       R"j({})j", R"j(a b|a|AB|ab|Hello world|3!|a+b+c|ab-c|cba)j"},
      {"filters_sequences",
       R"j({{ xs | length }}|{{ 'héllo' | length }}|{{ d | count }}|{{ xs | first }}|{{ xs | last }}|{{ xs | join(', ') }}|{{ xs | join }}|{{ [] | first }}|{{ xs | reverse | join }}|{{ d | list }}|{{ d | items | map('first') | join }}|{{ 'ab' | list }})j",
       R"j({"xs": ["a", "b", "c"], "d": {"b": 1, "a": 2}})j",
       R"j(3|5|2|a|c|a, b, c|abc||cba|['b', 'a']|ba|['a', 'b'])j"},
      {"filters_default",
       R"j({{ y | default('dflt') }}|{{ '' | default('empty', true) }}|{{ '' | default('empty') }}|{{ none | default('kept') }}|{{ y | d('alias') }}|{{ x | default(boolean=true, default_value='kw') }})j",
       R"j({"x": 0})j", R"j(dflt|empty||None|alias|kw)j"},
      {"filters_numbers",
       R"j({{ '3' | int + 1 }} {{ '2.5' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 2.9 | int }} {{ '2.5' | float }} {{ 3 | float }} {{ -2 | abs }} {{ -2.5 | abs }})j",
       R"j({})j", R"j(4 2 0 7 2 2.5 3.0 2 2.5)j"},
      {"filters_map_select",
       R"j({{ xs | map('upper') | list }} {{ ms | map(attribute='role') | join(',') }} {{ ms | selectattr('role', 'equalto', 'user') | list | length }} {{ ms | rejectattr('role', 'eq', 'user') | map(attribute='content') | first }} {{ [0, 1, 2, none] | select | list }} {{ [1, 2, 3, 4] | reject('odd') | list }} {{ ms | selectattr('content') | list | length }} {{ ms | map(attribute='missing', default='-') | join }})j",
       R"j({"xs": ["a", "b"], "ms": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "r"}, {"role": "user", "content": ""}]})j",
       R"j(['A', 'B'] user,assistant,user 2 r [1, 2] [2, 4] 2 ---)j"},
      {"tojson",
       "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ 'é\"\\\\\n\\t' | tojson }}|{{ [1.0, 1e-05, none, true, 10] | "
       "tojson }}|{{ d | tojson(sort_keys=true) }}|{{ [] | tojson(indent=2) }}|{{ 'é' | tojson(ensure_ascii=true) "
       "}}|{{ d | tojson(separators=[',', ':']) }}",
       R"j({"d": {"b": [1, {"c": 2}], "a": "x", "e": {}}})j",
       "{\"b\": [1, {\"c\": 2}], \"a\": \"x\", \"e\": {}}|{\n  \"b\": [\n    1,\n    {\n      \"c\": 2\n    }\n  ],\n  "
       "\"a\": \"x\",\n  \"e\": {}\n}|\"é\\\"\\\\\\n\\t\"|[1.0, 1e-05, null, true, 10]|{\"a\": \"x\", \"b\": [1, "
       "{\"c\": 2}], \"e\": {}}|[]|\"\\u00e9\"|{\"b\":[1,{\"c\":2}],\"a\":\"x\",\"e\":{}}"},
      {"indent",
       "{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}|{{ 'a\n\nb' | indent('> ', blank=true) }}",
       R"j({})j", "a\n  b\n\n  c|  a\n  b|a\n> \n> b"},
      {"string_methods",
       "{{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  x '.lstrip() }}|{{ ' x  '.rstrip() }}|{{ "
       "'\nx\n'.strip('\n') }}|{{ 'a b  c'.split() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a,b,c'.split(',', 1) }}|{{ '  a b  "
       "c '.split(none, 1) }}|{{ 'hello'.startswith('he') }}|{{ 'hello'.endswith(('x', 'lo')) }}|{{ 'Hi'.upper() }}{{ "
       "'Hi'.lower() }}|{{ 'a-b'.replace('-', '') }}|{{ 'hello world'.title() }}|{{ 'hello World'.capitalize() }}|{{ "
       "', '.join(['a', 'b']) }}|{{ 'abcb'.find('b') }}{{ 'abcb'.find('z') }}{{ 'abcb'.count('b') }}|{{ "
       "'a\nb'.splitlines() }}",
       R"j({})j",
       R"j(x|hi|x | x|x|['a', 'b', 'c']|['a', 'b', '', 'c']|['a', 'b,c']|['a', 'b  c ']|True|True|HIhi|ab|Hello World|Hello world|a, b|1-12|['a', 'b'])j"},
      {"dict_methods",
       R"j({% for k in d.keys() %}{{ k }}{% endfor %}|{% for v in d.values() %}{{ v }}{% endfor %}|{{ d.get('a') }}|{{ d.get('zz') }}|{{ d.get('zz', 'dflt') }}|{% for pair in d.items() %}{{ pair[0] }}{{ pair[1] }}{% endfor %})j",
       R"j({"d": {"b": 1, "a": 2}})j", R"j(ba|12|2|None|dflt|b1a2)j"},
      {"method_names_before_keys",
       R"j({{ p['items'].type }} {% if p.items is defined and q.items %}method{% endif %} {{ p.get('type') }} {{ 'x'.strip is defined }})j",
       R"j({"p": {"type": "array", "items": {"type": "string"}}, "q": {}})j", R"j(string method array True)j"},
      {"macro",
       R"j({% macro tag(name, value='?') %}<{{ name }}={{ value }}>{% endmacro %}{{ tag('a') }}{{ tag('b', 2) }}{{ tag(value=3, name='c') }})j",
       R"j({})j", R"j(<a=?><b=2><c=3>)j"},
      {"string_escapes", R"j({{ 'a\tb\n' }}{{ "it's" }}{{ 'q\'s' }}{{ '\u00e9\x41' }}{{ 'back\\slash' }}{{ '\d' }})j",
       R"j({})j", "a\tb\nit'sq'séAback\\slash\\d"},
      {"repr", R"j({{ ["it's", 'say "hi"', 'a\nb', 'é', 1.0, none, true] }} {{ {'a': [1, {'b': 'c'}]} }})j", R"j({})j",
       R"j(["it's", 'say "hi"', 'a\nb', 'é', 1.0, None, True] {'a': [1, {'b': 'c'}]})j"},
      {"floats",
       R"j({{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e-5 }} {{ 100.0 }} {{ 2.5e-7 }} {{ 10 / 4 }} {{ 1e15 }} {{ 0.0001 }} {{ 123456789.125 }} {{ -0.5 }} {{ 3 * 1.1 }} {{ 1_000 }})j",
       R"j({})j",
       R"j(0.30000000000000004 1e+16 1e-05 100.0 2.5e-07 2.5 1000000000000000.0 0.0001 123456789.125 -0.5 3.3000000000000003 1000)j"},
      {"undefined",
       R"j([{{ missing }}][{{ missing | length }}][{% for x in missing %}x{% endfor %}][{{ missing ~ 'a' }}][{{ d.nope }}][{{ missing is defined }}][{{ d.nope is defined }}][{{ missing == missing }}][{{ 'x' in missing }}][{{ not missing }}])j",
       R"j({"d": {}})j", R"j([][0][][a][][False][False][True][False][True])j"},
      {"literals_nested",
       R"j({{ {'x': 1, 'y': [1, 2]}['y'][1] }} {{ ({'a': 1}).a }} {{ [1, [2, 3]][1][0] }} {{ (1, 2) | list }} {{ (1, 2)[1] }})j",
       R"j({})j", R"j(2 1 2 [1, 2] 2)j"},
      {"generation_block", R"j(a{% generation %}gen {{ 1 }}{% endgeneration %}b)j", R"j({})j", R"j(agen 1b)j"},
      {"precedence",
       R"j({{ -1 | abs }} {{ 'ab' ~ 'cd' | upper }} {{ not 'x' is string }} {{ 1 ~ 2 | string }} {{ 2 * 3 ** 2 }} {{ 'a' if 1 > 2 or 3 > 2 else 'b' }})j",
       R"j({})j", R"j(1 abCD False 12 18 a)j"},
      {"globals",
       R"j({{ dict(a=1, b='x') }} {{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(3, 0, -1) | list }} {{ namespace(a=1).a }})j",
       R"j({})j", R"j({'a': 1, 'b': 'x'} [0, 1, 2] [1, 3, 5] [3, 2, 1] 1)j"},
      {"messages_loop",
       "{% for message in messages %}{% if message['role'] == 'system' %}[S]{{ message['content'] }}{% elif "
       "message.role == 'user' %}[U]{{ message.content | trim }}{% else %}[A]{{ message.content }}{% endif %}{% if not "
       "loop.last %}\n{% endif %}{% endfor %}{% if add_generation_prompt %}\n[A]{% endif %}",
       R"j({"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": " hi "}, {"role": "assistant", "content": "yo"}], "add_generation_prompt": true})j",
       R"j([S]sys[U]hi[A]yo[A])j"},
  };
  return cases;
}

}  // namespace colossus::data::chat::testing
