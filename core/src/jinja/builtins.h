// The Jinja engine's built-ins: filters and tests (filters.cpp), str/dict/list methods and the
// globals of transformers' environment (methods.cpp). Each throws TemplateError at p; each charges
// the render's budget for what it scans or makes, and sizes what it makes before making it.
#pragma once

#include <string>
#include <unordered_map>

#include "jinja/eval.h"

namespace ciuic::jinja {

Value apply_filter(Ctx& c, Pos p, const std::string& name, const Value& v, CallArgs& args);
bool apply_test(Ctx& c, Pos p, const std::string& name, const Value& v, CallArgs& args);

bool is_method(const Value& obj, const std::string& name);
// Python's `fmt % args` (str.__mod__; a Markup format escapes the arguments) and str.format()
// (format.cpp), with Python's error messages.
Value percent_format(Ctx& c, Pos p, const Value& fmt, const Value& args);
std::string str_format(Ctx& c, Pos p, const std::string& fmt, CallArgs& a);
Value call_method(Ctx& c, Pos p, const Value& obj, const std::string& name, CallArgs& a);
// raise_exception, range (at most Limits::max_range items), namespace, dict, strftime_now.
void add_globals(std::unordered_map<std::string, Value>& g);

// Arguments: positional i or keyword `name` (null name: positional only); null when absent.
const Value* kwarg(CallArgs& a, const char* name);
const Value* arg(CallArgs& a, size_t i, const char* name);
std::string need_str(Ctx& c, Pos p, const Value* v, const char* what);
Value str_list(const std::vector<std::string>& v);

}  // namespace ciuic::jinja
