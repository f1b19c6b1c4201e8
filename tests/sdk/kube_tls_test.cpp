// The Kubernetes backend over TLS as a kubeconfig asks for it, against the fake API server
// (tests/sdk/kube_api_server.py) with a CA, server and client certificates made afresh for each
// test: the CA from certificate-authority-data or a certificate-authority file; a bearer token or
// a client certificate (inline or as files) as the credential; a server requiring client
// certificates refusing none or one from another CA; a wrong CA refused before any request,
// naming the server and the kubeconfig; insecure-skip-tls-verify; the in-cluster service account;
// and plain HTTP where a server speaks it (kubectl proxy).
// It does not test the system CA store beyond "it does not trust this test CA".
#include "kube_test_support.h"

#include <regex>

namespace ktune::sdk {
namespace {

using namespace kube_testing;  // NOLINT: the shared fixture and helpers (fs, Json, TempDir, write_file, run_command)

// A bearer token over TLS, the server verified against the cluster CA given inline
// (certificate-authority-data) or as a file next to the kubeconfig; localhost and 127.0.0.1 are
// both names in the server's certificate.
TEST_F(KubernetesBackendTest, TokenOverTlsWithTheCaFromDataOrFile) {
  EXPECT_TRUE(backend().list_jobs().empty());
  write_file(dir_ / "certs/cluster-ca.crt", pem("ca.crt"));
  const std::string from_file = kubeconfig_yaml(server_url("localhost"), "    certificate-authority: certs/cluster-ca.crt\n",
                                                "    token: " + kToken + "\n");
  const KubeConnection c = parse_kubeconfig(from_file, dir_ / "kubeconfig-file");
  EXPECT_EQ(c.tls.ca_file, dir_ / "certs/cluster-ca.crt");
  EXPECT_TRUE(KubernetesBackend(c, "").list_jobs().empty());
  const Json log = requests();
  ASSERT_EQ(log["requests"].size(), 2u) << log.dump(1);
  for (const Json& r : log["requests"]) {
    EXPECT_EQ(r["tls"], true);
    EXPECT_EQ(r["method"], "GET");
    EXPECT_EQ(r["path"], "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs");
    EXPECT_EQ(r["headers"]["authorization"], "Bearer " + kToken);
    EXPECT_EQ(r["headers"]["accept"], "application/json");
    EXPECT_EQ(r["client_cn"], "");
  }
  EXPECT_TRUE(log["tls_failures"].empty()) << log["tls_failures"].dump();
}

// A server that requires client certificates: the user's certificate and key, inline or as
// files, authenticate without a token; no certificate, or one another CA signed, is refused at
// the handshake with an error that says so.
TEST_F(KubernetesBackendTest, ClientCertificatesAuthenticateAsDataOrFiles) {
  TempDir dir;
  auto strict = start_server(dir / "pki", "required");
  ASSERT_TRUE(strict->ready());
  const std::string server = "https://127.0.0.1:" + std::to_string(strict->port());
  const int control_port = strict->info().value("control_port", 0);
  auto read = [&](const std::string& name) { return hub::testing::read_file(dir / ("pki/" + name)); };
  const std::string ca = "    certificate-authority-data: " + hub::base64_encode(read("ca.crt")) + "\n";
  const std::string path = dir / "config";

  const KubeConnection inline_cert = parse_kubeconfig(
      kubeconfig_yaml(server, ca, "    client-certificate-data: " + hub::base64_encode(read("client.crt")) + "\n" +
                                      "    client-key-data: " + hub::base64_encode(read("client.key")) + "\n"),
      path);
  EXPECT_TRUE(inline_cert.bearer_token.empty());
  EXPECT_TRUE(KubernetesBackend(inline_cert, "").list_jobs().empty());
  write_file(dir / "user/tester.crt", read("client.crt"));
  write_file(dir / "user/tester.key", read("client.key"));
  const KubeConnection file_cert = parse_kubeconfig(
      kubeconfig_yaml(server, ca, "    client-certificate: user/tester.crt\n    client-key: user/tester.key\n"), path);
  EXPECT_TRUE(KubernetesBackend(file_cert, "").list_jobs().empty());
  Json log = control(control_port, "GET", "/_test/requests");
  ASSERT_EQ(log["requests"].size(), 2u) << log.dump(1);
  for (const Json& r : log["requests"]) {
    EXPECT_EQ(r["client_cn"], "tester");  // the certificate the server verified
    EXPECT_FALSE(r["headers"].contains("authorization"));
  }

  // A token alone does not pass a server that requires a certificate.
  const std::string no_cert = error_of([&] {
    KubernetesBackend(parse_kubeconfig(kubeconfig_yaml(server, ca, "    token: " + kToken + "\n"), path), "").list_jobs();
  });
  EXPECT_NE(no_cert.find("cannot reach the API server " + server + " (kubeconfig " + path + " (context fake))"),
            std::string::npos) << no_cert;
  // The server's alert names the reason (TLS 1.3: "certificate required"); should it be lost in a
  // race with the request, the error still points at the client certificate.
  EXPECT_NE(no_cert.find("client certificate"), std::string::npos) << no_cert;
  EXPECT_EQ(no_cert.find(kToken), std::string::npos);
  // A certificate from a CA the cluster does not trust.
  const std::string untrusted = error_of([&] {
    KubernetesBackend(parse_kubeconfig(kubeconfig_yaml(server, ca,
                                                       "    client-certificate-data: " + hub::base64_encode(read("other-client.crt")) +
                                                           "\n    client-key-data: " + hub::base64_encode(read("other-client.key")) + "\n"),
                                       path),
                      "")
        .list_jobs();
  });
  EXPECT_NE(untrusted.find("client certificate"), std::string::npos) << untrusted;
  log = control(control_port, "GET", "/_test/requests");
  EXPECT_EQ(log["requests"].size(), 2u) << "a refused handshake reached the API";
  EXPECT_FALSE(log["tls_failures"].empty());
  // A key file that is not there: named, not a handshake mystery.
  const std::string missing_key = error_of([&] {
    KubernetesBackend(parse_kubeconfig(kubeconfig_yaml(server, ca, "    client-certificate: user/tester.crt\n    client-key: user/nope.key\n"), path),
                      "")
        .list_jobs();
  });
  EXPECT_NE(missing_key.find("cannot reach the API server " + server), std::string::npos) << missing_key;
  EXPECT_NE(missing_key.find("client certificate or key"), std::string::npos) << missing_key;
}

// A server whose certificate the kubeconfig's CA did not sign is refused before any request is
// sent (so the token never leaves), with an error naming the server, the kubeconfig and the fix;
// without a CA the system's store does not trust it either. insecure-skip-tls-verify is honoured.
TEST_F(KubernetesBackendTest, AWrongCaIsRefusedUnlessVerificationIsSkipped) {
  const std::string wrong_ca = "    certificate-authority-data: " + hub::base64_encode(pem("other-ca.crt")) + "\n";
  const std::string token = "    token: " + kToken + "\n";
  const std::string wrong = error_of([&] {
    KubernetesBackend(parse_kubeconfig(kubeconfig_yaml(server_url(), wrong_ca, token), kubeconfig_), "").list_jobs();
  });
  EXPECT_NE(wrong.find("cannot reach the API server " + server_url() + " (kubeconfig " + kubeconfig_ + " (context fake))"),
            std::string::npos) << wrong;
  EXPECT_NE(wrong.find("does not verify against the CA this kubeconfig gives"), std::string::npos) << wrong;
  EXPECT_NE(wrong.find("insecure-skip-tls-verify"), std::string::npos) << wrong;
  EXPECT_EQ(wrong.find(kToken), std::string::npos);
  const std::string system_cas = error_of([&] {
    KubernetesBackend(parse_kubeconfig(kubeconfig_yaml(server_url(), "", token), kubeconfig_), "").list_jobs();
  });
  EXPECT_NE(system_cas.find("does not verify against the CA"), std::string::npos) << system_cas;
  EXPECT_TRUE(requests()["requests"].empty()) << "a request went to a server that was not verified";

  // The same from the shell: exit 1, the message, no token.
  if (fs::exists(kKtune)) {
    write_file(dir_ / "wrong-kubeconfig", kubeconfig_yaml(server_url(), wrong_ca, token));
    std::vector<std::string> argv{kKtune, "jobs", "list", "--backend", "kubernetes"};
    const CommandResult r = run_command(argv, {{"KUBECONFIG", dir_ / "wrong-kubeconfig"}, {"KTUNE_HOME", dir_ / "home"}});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("does not verify against the CA"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(dir_ / "wrong-kubeconfig"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find(kToken), std::string::npos) << r.err;
  }

  // insecure-skip-tls-verify: the wrong CA, or none, is not checked.
  for (const std::string& cluster : {wrong_ca + "    insecure-skip-tls-verify: true\n", std::string("    insecure-skip-tls-verify: true\n")})
    EXPECT_TRUE(KubernetesBackend(parse_kubeconfig(kubeconfig_yaml(server_url(), cluster, token), kubeconfig_), "")
                    .list_jobs()
                    .empty());
  EXPECT_EQ(requests()["requests"].size(), 2u);
}

// Inside a pod: the service account's token and ca.crt, over TLS.
TEST_F(KubernetesBackendTest, TheInClusterServiceAccountSpeaksTls) {
  write_file(dir_ / "sa/token", kToken + "\n");
  write_file(dir_ / "sa/ca.crt", pem("ca.crt"));
  write_file(dir_ / "sa/namespace", "team-a\n");
  KubernetesBackend k(in_cluster_connection("127.0.0.1", std::to_string(port_), dir_ / "sa"), "");
  EXPECT_EQ(k.kubernetes_namespace(), "team-a");
  EXPECT_TRUE(k.list_jobs().empty());
  const Json log = requests();
  ASSERT_EQ(log["requests"].size(), 1u);
  EXPECT_EQ(log["requests"][0]["headers"]["authorization"], "Bearer " + kToken);
  EXPECT_EQ(log["requests"][0]["tls"], true);
}

// Plain HTTP still works: what `kubectl proxy` serves on localhost.
TEST(KubernetesBackendPlainHttp, AKubectlProxyStyleServerIsSpokenToWithoutTls) {
  TempDir dir;
  auto plain = start_server("");
  ASSERT_TRUE(plain->ready());
  const std::string config = kubeconfig_yaml("http://127.0.0.1:" + std::to_string(plain->port()), "", "    token: " + kToken + "\n");
  EXPECT_TRUE(KubernetesBackend(parse_kubeconfig(config, dir / "config"), "").list_jobs().empty());
  const Json log = control(plain->info().value("control_port", 0), "GET", "/_test/requests");
  ASSERT_EQ(log["requests"].size(), 1u);
  EXPECT_EQ(log["requests"][0]["tls"], false);
}

}  // namespace
}  // namespace ktune::sdk
